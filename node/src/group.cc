// ProcessGroup: the collectives, point-to-point, subgroups and failure
// handling of one uvccl group, each call returning a Promise.
#include <cstring>

#include "group.h"

namespace uvccl_node {

// ---- the collectives of one buffer in place or of an (output, input) pair,
// through one entry point chosen by a table. Every call comes as
// (output, input, root, op, dtype, timeout); what an op has no use for is
// null/undefined.
enum CollKind {
  COLL_ALLREDUCE,
  COLL_BROADCAST,
  COLL_REDUCE,
  COLL_ALLGATHER,
  COLL_REDUCE_SCATTER,
  COLL_ALLTOALL,
  COLL_GATHER,
  COLL_SCATTER,
};

// In the order of enum CollKind. shape: 0 one buffer in place (the output); 1 output = size x input; -1
// input = size x output; 2 output and input of one length. root_side: the
// output (1) or the input (-1) exists at the root only.
static const struct {
  const char *name;
  bool reduces;
  int shape;
  int root_side;
} colls[] = {
  {"allreduce", true, 0, 0},
  {"broadcast", false, 0, 0},
  {"reduce", true, 0, 0},
  {"allgather", false, 1, 0},
  {"reduceScatter", true, -1, 0},
  {"alltoall", false, 2, 0},
  {"gather", false, 1, 1},
  {"scatter", false, -1, -1},
};

static bool absent(Napi::Value v) { return v.IsNull() || v.IsUndefined(); }

static void pg_closed(uvccl_pg_t *pg) {
  close_done(static_cast<Box *>(pg->data));
}

void PgBox::Close() { uvccl_pg_destroy(&pg, pg_closed); }
void PgBox::Leave() { uvccl_pg_abort(&pg, "its Node.js environment ended"); }

// (the wrapper forgets its group: at teardown, or when the group closes)
void PgBox::Orphan() {
  Group *g = static_cast<Group *>(owner);
  g->box = nullptr;
  g->state = Group::GONE;
}

Napi::Function Group::Define(Napi::Env env) {
  std::vector<PropertyDescriptor> props;
  for (int i = 0; i <= COLL_SCATTER; i++)
    props.push_back(InstanceMethod(colls[i].name, &Group::Coll, napi_default,
                                   reinterpret_cast<void *>(
                                       static_cast<intptr_t>(i))));
  props.push_back(InstanceMethod("allreduceCoalesced", &Group::AllreduceCoalesced));
  props.push_back(InstanceMethod("allgatherv", &Group::Allgatherv));
  props.push_back(InstanceMethod("reduceScatterv", &Group::ReduceScatterv));
  props.push_back(InstanceMethod("alltoallv", &Group::Alltoallv));
  props.push_back(InstanceMethod("barrier", &Group::Barrier));
  props.push_back(InstanceMethod("p2pBatch", &Group::P2pBatch));
  props.push_back(InstanceMethod("premulSum", &Group::PremulSum));
  {
    static const char *const bytes_names[] = {"broadcastBytes", "allgatherBytes",
                                              "gatherBytes", "scatterBytes"};
    for (intptr_t i = 0; i < 4; i++)
      props.push_back(InstanceMethod(bytes_names[i], &Group::BytesColl, napi_default,
                                     reinterpret_cast<void *>(i)));
  }
  props.push_back(InstanceMethod("monitoredBarrier", &Group::MonitoredBarrier));
  props.push_back(InstanceMethod("send", &Group::Send));
  props.push_back(InstanceMethod("recv", &Group::Recv));
  props.push_back(InstanceMethod("split", &Group::Split));
  props.push_back(InstanceMethod("shrink", &Group::Shrink));
  props.push_back(InstanceMethod("newGroup", &Group::NewGroup));
  props.push_back(InstanceMethod("revoke", &Group::Revoke));
  props.push_back(InstanceMethod("abort", &Group::Abort));
  props.push_back(InstanceMethod("destroy", &Group::Destroy));
  props.push_back(InstanceMethod("failure", &Group::Failure));
  props.push_back(InstanceMethod("globalRank", &Group::GlobalRank));
  props.push_back(InstanceMethod("peerTransport", &Group::PeerTransport));
  props.push_back(InstanceMethod("setTimeout", &Group::SetTimeout));
  props.push_back(InstanceAccessor("rank", &Group::GetRank, nullptr));
  props.push_back(InstanceAccessor("size", &Group::GetSize, nullptr));
  return DefineClass(env, "CoreGroup", props);
}

Napi::Object Group::Make(Napi::Env env, Group **out) {
  Napi::Object o = addon_of(env)->group_ctor.New({});
  *out = Group::Unwrap(o);
  return o;
}

Group::Group(const Napi::CallbackInfo &info) : Napi::ObjectWrap<Group>(info) {
  addon = addon_of(info.Env());
  addon->ref();
  box = new PgBox(info.Env());
  box->owner = this;
}

// The wrapper was collected: a group still open is destroyed (its handles
// would otherwise keep the loop, and the process, alive for nothing). A
// wrapper with operations in flight is collected only when its
// environment is torn down.
Group::~Group() {
  if (pending > 0) addon->gone = true;
  if (box != nullptr) {
    box->owner = nullptr;
    if (box->live)
      close_box(box);
    else
      delete box;
  }
  addon->unref();
}

void Group::Created(int status) {
  if (box == nullptr) { // closed at teardown meanwhile
    state = GONE;
    return;
  }
  if (status == 0) {
    state = READY;
    return;
  }
  state = GONE;
  // A failed creation still holds resources; one that never started, or a
  // split that leaves this rank out, made nothing.
  PgBox *b = box;
  box = nullptr;
  b->owner = nullptr;
  if (!b->live || status == UVCCL_ENOTMEMBER)
    delete b;
  else
    close_box(b);
}

uvccl_pg_t *Group::Ready(Napi::Env env, const char *opname) {
  if (state != READY) {
    std::string msg = std::string(opname) + ": the group " +
                      (state == GONE ? "was destroyed" : "is not ready yet");
    throw_status(env, UVCCL_ECLOSING, opname, msg.c_str(), nullptr);
  }
  return &box->pg;
}

Napi::Value Group::GetRank(const Napi::CallbackInfo &info) {
  return Napi::Number::New(info.Env(), state == READY ? box->pg.rank : -1);
}

Napi::Value Group::GetSize(const Napi::CallbackInfo &info) {
  return Napi::Number::New(info.Env(), state == READY ? box->pg.size : 0);
}

// A new operation of this group (the group kept alive until it completes).
static Op *group_op(Group *g, const Napi::CallbackInfo &info, Result r) {
  return new Op(info.Env(), g, r);
}

// Runs body (which starts op or throws): a throw rejects the Promise, never
// the call, and frees op.
template <typename F>
static Napi::Value guarded(Napi::Env env, Op **op, const char *name, F body) {
  try {
    return body();
  } catch (const Napi::Error &e) {
    Op *o = *op;
    *op = nullptr;
    return rejected(o, e);
  }
}

static int int_arg(const Napi::CallbackInfo &info, size_t i, int dflt) {
  return info[i].IsNumber() ? info[i].As<Napi::Number>().Int32Value() : dflt;
}

Napi::Value Group::Coll(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  CollKind which = static_cast<CollKind>(reinterpret_cast<intptr_t>(info.Data()));
  const char *name = colls[which].name;
  Op *op = nullptr;
  return guarded(env, &op, name, [&]() -> Napi::Value {
    uvccl_pg_t *pg = Ready(env, name);
    Napi::Value out = info[0], in = info[1];
    int root = int_arg(info, 2, 0);
    uvccl_redop_t rop = UVCCL_SUM;
    std::string dtn = str_or(info[4], "");
    if (colls[which].reduces) rop = redop_of(env, info[3], name);
    if (colls[which].root_side != 0) {
      Napi::Value &side = colls[which].root_side > 0 ? out : in;
      if (pg->rank == root && absent(side))
        throw Napi::TypeError::New(
            env, std::string(name) + ": the root needs an " +
                     (colls[which].root_side > 0 ? "output" : "input"));
      if (pg->rank != root) side = env.Null(); // unused there
    }
    op = group_op(this, info, RES_HELD);
    uvccl_dtype_t dt = UVCCL_UINT8, din = UVCCL_UINT8;
    size_t no = 0, ni = 0;
    View vo, vi;
    bool moving = !colls[which].reduces;
    if (!absent(out)) {
      vo = hold(op, out, name, colls[which].shape == 0 ? "the buffer" : "the output");
      no = dtype_of(env, vo, dtn, moving, name, &dt);
      op->value_at = static_cast<int>(op->held.size()) - 1;
    }
    if (colls[which].shape != 0 && !absent(in)) {
      vi = hold(op, in, name, "the input");
      ni = dtype_of(env, vi, dtn, moving, name, &din);
      if (absent(out)) dt = din;
    }
    if (colls[which].shape == 0 && absent(out))
      throw Napi::TypeError::New(env, std::string(name) + ": a buffer is needed");
    if (colls[which].shape != 0 && !absent(out) && !absent(in)) {
      if (dt != din)
        throw Napi::TypeError::New(env, std::string(name) + ": the output holds " +
                                            uvccl_dtype_name(dt) + ", the input " +
                                            uvccl_dtype_name(din));
      int shape = colls[which].shape;
      size_t k = shape == 2 ? 1 : static_cast<size_t>(pg->size);
      if ((shape >= 1 && no != ni * k) || (shape == -1 && ni != no * k))
        throw Napi::RangeError::New(
            env, std::string(name) + ": the output holds " + std::to_string(no) +
                     " elements and the input " + std::to_string(ni) + "; with " +
                     std::to_string(pg->size) + " ranks the " +
                     (shape == -1 ? "input" : "output") + " must hold " +
                     (shape == 2 ? "as many as the " : std::to_string(k) + " times the ") +
                     (shape == -1 ? "output's" : "input's"));
    }
    if (which == COLL_ALLTOALL && ni % static_cast<size_t>(pg->size) != 0)
      throw Napi::RangeError::New(env, "alltoall: " + std::to_string(ni) +
                                           " elements do not split into " +
                                           std::to_string(pg->size) + " equal blocks");
    op->work.timeout_ms = timeout_of(info[5]);
    void *ob = vo.data, *ib = vi.data;
    int rc;
    switch (which) {
    case COLL_ALLREDUCE:
      rc = uvccl_allreduce(pg, &op->work, ob, ob, no, dt, rop, op_done);
      break;
    case COLL_BROADCAST:
      rc = uvccl_broadcast(pg, &op->work, ob, no, dt, root, op_done);
      break;
    case COLL_REDUCE:
      rc = uvccl_reduce(pg, &op->work, ob, ob, no, dt, rop, root, op_done);
      break;
    case COLL_ALLGATHER:
      rc = uvccl_allgather(pg, &op->work, ib, ob, ni, dt, op_done);
      break;
    case COLL_REDUCE_SCATTER:
      rc = uvccl_reduce_scatter(pg, &op->work, ib, ob, no, dt, rop, op_done);
      break;
    case COLL_ALLTOALL:
      rc = uvccl_alltoall(pg, &op->work, ib, ob, ni / static_cast<size_t>(pg->size),
                          dt, op_done);
      break;
    case COLL_GATHER:
      rc = uvccl_gather(pg, &op->work, ib, ob, ni, dt, root, op_done);
      break;
    default:
      rc = uvccl_scatter(pg, &op->work, ib, ob, no, dt, root, op_done);
    }
    Op *started_op = op;
    op = nullptr;
    return started(started_op, rc, name);
  });
}

// A JS array of exactly n non-negative integers.
static std::vector<size_t> counts_of(Napi::Env env, Napi::Value v, int n,
                                     const char *opname, const char *what) {
  if (!v.IsArray())
    throw Napi::TypeError::New(env, std::string(opname) + ": " + what +
                                        " must be an array of counts");
  Napi::Array a = v.As<Napi::Array>();
  if (a.Length() != static_cast<uint32_t>(n))
    throw Napi::RangeError::New(env, std::string(opname) + ": " + what + " has " +
                                         std::to_string(a.Length()) +
                                         " entries, not one a rank (" +
                                         std::to_string(n) + ")");
  std::vector<size_t> c(static_cast<size_t>(n));
  for (int i = 0; i < n; i++) {
    Napi::Value e = a.Get(static_cast<uint32_t>(i));
    double d = e.IsNumber() ? e.As<Napi::Number>().DoubleValue() : -1;
    if (!(d >= 0) || d != static_cast<double>(static_cast<size_t>(d)))
      throw Napi::RangeError::New(env, std::string(opname) + ": " + what + "[" +
                                           std::to_string(i) +
                                           "] is not a non-negative integer");
    c[static_cast<size_t>(i)] = static_cast<size_t>(d);
  }
  return c;
}

static size_t sum_of(const size_t *c, int n) {
  size_t s = 0;
  for (int i = 0; i < n; i++) s += c[i];
  return s;
}

// alltoallv(output, input, sendCounts, recvCounts, dtype, timeout)
Napi::Value Group::Alltoallv(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  Op *op = nullptr;
  return guarded(env, &op, "alltoallv", [&]() -> Napi::Value {
    uvccl_pg_t *pg = Ready(env, "alltoallv");
    std::string dtn = str_or(info[4], "");
    op = group_op(this, info, RES_HELD);
    uvccl_dtype_t dt, din;
    View vo = hold(op, info[0], "alltoallv", "the output");
    op->value_at = 0;
    View vi = hold(op, info[1], "alltoallv", "the input");
    size_t no = dtype_of(env, vo, dtn, true, "alltoallv", &dt);
    size_t ni = dtype_of(env, vi, dtn, true, "alltoallv", &din);
    if (dt != din)
      throw Napi::TypeError::New(env, std::string("alltoallv: the output holds ") +
                                          uvccl_dtype_name(dt) + ", the input " +
                                          uvccl_dtype_name(din));
    std::vector<size_t> s = counts_of(env, info[2], pg->size, "alltoallv", "sendCounts");
    std::vector<size_t> r = counts_of(env, info[3], pg->size, "alltoallv", "recvCounts");
    if (sum_of(s.data(), pg->size) != ni || sum_of(r.data(), pg->size) != no)
      throw Napi::RangeError::New(
          env, "alltoallv: the send counts add up to " +
                   std::to_string(sum_of(s.data(), pg->size)) +
                   " elements (the input holds " + std::to_string(ni) +
                   "), the receive counts to " +
                   std::to_string(sum_of(r.data(), pg->size)) +
                   " (the output holds " + std::to_string(no) + ")");
    op->counts = s;
    op->counts.insert(op->counts.end(), r.begin(), r.end());
    op->work.timeout_ms = timeout_of(info[5]);
    Op *o = op;
    op = nullptr;
    return started(o, uvccl_alltoallv(pg, &o->work, vi.data, o->counts.data(),
                                      vo.data, o->counts.data() + pg->size, dt,
                                      op_done),
                   "alltoallv");
  });
}

// reduceScatterv(output, input, counts, op, dtype, timeout)
Napi::Value Group::ReduceScatterv(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  Op *op = nullptr;
  const char *name = "reduceScatterv";
  return guarded(env, &op, name, [&]() -> Napi::Value {
    uvccl_pg_t *pg = Ready(env, name);
    uvccl_redop_t rop = redop_of(env, info[3], name);
    std::string dtn = str_or(info[4], "");
    op = group_op(this, info, RES_HELD);
    uvccl_dtype_t dt, din;
    View vo = hold(op, info[0], name, "the output");
    op->value_at = 0;
    View vi = hold(op, info[1], name, "the input");
    size_t no = dtype_of(env, vo, dtn, false, name, &dt);
    size_t ni = dtype_of(env, vi, dtn, false, name, &din);
    if (dt != din)
      throw Napi::TypeError::New(env, std::string(name) + ": the output holds " +
                                          uvccl_dtype_name(dt) + ", the input " +
                                          uvccl_dtype_name(din));
    op->counts = counts_of(env, info[2], pg->size, name, "counts");
    size_t *c = op->counts.data();
    if (sum_of(c, pg->size) != ni || c[pg->rank] != no)
      throw Napi::RangeError::New(
          env, std::string(name) + ": the counts add up to " +
                   std::to_string(sum_of(c, pg->size)) + " elements (the input holds " +
                   std::to_string(ni) + ") and this rank's is " +
                   std::to_string(c[pg->rank]) + " (the output holds " +
                   std::to_string(no) + ")");
    op->work.timeout_ms = timeout_of(info[5]);
    Op *o = op;
    op = nullptr;
    return started(o, uvccl_reduce_scatterv(pg, &o->work, vi.data, vo.data, c, dt,
                                            rop, op_done),
                   name);
  });
}

// allgatherv(outputs, input, dtype, timeout): outputs[i] receives rank i's
// input, whatever its length.
Napi::Value Group::Allgatherv(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  Op *op = nullptr;
  return guarded(env, &op, "allgatherv", [&]() -> Napi::Value {
    uvccl_pg_t *pg = Ready(env, "allgatherv");
    std::string dtn = str_or(info[2], "");
    if (!info[0].IsArray())
      throw Napi::TypeError::New(env, "allgatherv: outputs must be an array of buffers");
    Napi::Array outs = info[0].As<Napi::Array>();
    if (outs.Length() != static_cast<uint32_t>(pg->size))
      throw Napi::RangeError::New(env, "allgatherv: " + std::to_string(outs.Length()) +
                                           " outputs, not one a rank (" +
                                           std::to_string(pg->size) + ")");
    op = group_op(this, info, RES_HELD);
    op->held.push_back(Napi::Persistent(info[0])); // the list, resolved with
    op->value_at = 0;
    uvccl_dtype_t dt, d;
    View vi = hold(op, info[1], "allgatherv", "the input");
    size_t ni = dtype_of(env, vi, dtn, true, "allgatherv", &dt);
    for (int i = 0; i < pg->size; i++) {
      View v = hold(op, outs.Get(static_cast<uint32_t>(i)), "allgatherv", "each output");
      size_t n = dtype_of(env, v, dtn, true, "allgatherv", &d);
      if (d != dt)
        throw Napi::TypeError::New(env, "allgatherv: output " + std::to_string(i) +
                                            " holds " + uvccl_dtype_name(d) +
                                            ", the input " + uvccl_dtype_name(dt));
      op->counts.push_back(n);
      op->ptrs.push_back(v.data);
    }
    if (op->counts[static_cast<size_t>(pg->rank)] != ni)
      throw Napi::RangeError::New(
          env, "allgatherv: this rank's output holds " +
                   std::to_string(op->counts[static_cast<size_t>(pg->rank)]) +
                   " elements, its input " + std::to_string(ni));
    op->work.timeout_ms = timeout_of(info[3]);
    Op *o = op;
    op = nullptr;
    return started(o, uvccl_allgatherv(pg, &o->work, vi.data, ni, o->ptrs.data(),
                                       o->counts.data(), dt, op_done),
                   "allgatherv");
  });
}

// allreduceCoalesced(buffers, op, dtype, timeout): every buffer in place,
// one operation.
Napi::Value Group::AllreduceCoalesced(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  Op *op = nullptr;
  const char *name = "allreduceCoalesced";
  return guarded(env, &op, name, [&]() -> Napi::Value {
    uvccl_pg_t *pg = Ready(env, name);
    uvccl_redop_t rop = redop_of(env, info[1], name);
    std::string dtn = str_or(info[2], "");
    if (!info[0].IsArray())
      throw Napi::TypeError::New(env, "allreduceCoalesced: an array of buffers");
    Napi::Array list = info[0].As<Napi::Array>();
    op = group_op(this, info, RES_HELD);
    op->held.push_back(Napi::Persistent(info[0])); // the list, resolved with
    op->value_at = 0;
    uvccl_dtype_t dt = UVCCL_FLOAT32, d;
    for (uint32_t i = 0; i < list.Length(); i++) {
      View v = hold(op, list.Get(i), name, "each buffer");
      dtype_of(env, v, dtn, false, name, &d);
      if (i > 0 && d != dt)
        throw Napi::TypeError::New(env, std::string(name) + ": buffer " +
                                            std::to_string(i) + " holds " +
                                            uvccl_dtype_name(d) + ", buffer 0 " +
                                            uvccl_dtype_name(dt));
      dt = d;
      op->bufs.push_back(uvccl_buf_t{v.data, v.len});
    }
    op->work.timeout_ms = timeout_of(info[3]);
    Op *o = op;
    op = nullptr;
    return started(o, uvccl_allreduce_coalesced(pg, &o->work, o->bufs.data(),
                                                o->bufs.size(), dt, rop, op_done),
                   name);
  });
}

// p2pBatch([[isSend, buffer, peer, tag], ...], timeout): c10d's
// batch_isend_irecv, every op at once; an entry an op, null for a send,
// {source, length} for a receive
Napi::Value Group::P2pBatch(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  Op *op = nullptr;
  const char *name = "batchIsendIrecv";
  return guarded(env, &op, name, [&]() -> Napi::Value {
    uvccl_pg_t *pg = Ready(env, name);
    if (!info[0].IsArray())
      throw Napi::TypeError::New(env, "batchIsendIrecv: an array of ops");
    Napi::Array list = info[0].As<Napi::Array>();
    uint64_t to = timeout_of(info[1]);
    op = group_op(this, info, RES_BATCH);
    for (uint32_t i = 0; i < list.Length(); i++) {
      Napi::Value e = list.Get(i);
      Napi::Array t = e.IsArray() ? e.As<Napi::Array>() : Napi::Array::New(env);
      if (t.Length() != 4 || !t.Get(2u).IsNumber())
        throw Napi::TypeError::New(env, "batchIsendIrecv: op " + std::to_string(i) +
                                            " needs a buffer and a peer");
      bool send = t.Get(0u).ToBoolean();
      View v = hold(op, t.Get(1u), name, "each op's buffer");
      uvccl_p2p_op_t p{};
      p.is_send = send;
      p.buf = v.data;
      p.len = v.len;
      p.peer = t.Get(2u).As<Napi::Number>().Int32Value();
      p.tag = t.Get(3u).IsNumber() ? t.Get(3u).As<Napi::Number>().Int32Value() : 0;
      op->p2p.push_back(p);
    }
    op->work.timeout_ms = to;
    Op *o = op;
    op = nullptr;
    return started(o, uvccl_p2p_batch(pg, &o->work, o->p2p.data(), o->p2p.size(), op_done),
                   name);
  });
}

// The byte payloads of different lengths under c10d's object collectives:
// broadcastBytes(buffer or null, root) -> a Buffer (root's);
// allgatherBytes(buffer) -> every rank's; gatherBytes(buffer, root) ->
// every rank's at root, null elsewhere; scatterBytes(buffers or null,
// root) -> this rank's.
enum BytesKind { BYTES_BROADCAST, BYTES_ALLGATHER, BYTES_GATHER, BYTES_SCATTER };

Napi::Value Group::BytesColl(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  BytesKind which = static_cast<BytesKind>(reinterpret_cast<intptr_t>(info.Data()));
  static const char *const names[] = {"broadcastBytes", "allgatherBytes", "gatherBytes",
                                      "scatterBytes"};
  const char *name = names[which];
  Op *op = nullptr;
  return guarded(env, &op, name, [&]() -> Napi::Value {
    uvccl_pg_t *pg = Ready(env, name);
    int root = int_arg(info, 1, 0);
    bool at_root = pg->rank == root;
    uint64_t to = timeout_of(info[2]);
    op = group_op(this, info, which == BYTES_ALLGATHER || which == BYTES_GATHER ? RES_VALUES
                                                                               : RES_VALUE);
    op->work.timeout_ms = to;
    int rc;
    if (which == BYTES_SCATTER) {
      if (at_root) {
        if (!info[0].IsArray() || info[0].As<Napi::Array>().Length() != static_cast<uint32_t>(pg->size))
          throw Napi::TypeError::New(env, "scatterBytes: the root gives an array of one "
                                          "buffer a rank (" + std::to_string(pg->size) + ")");
        Napi::Array a = info[0].As<Napi::Array>();
        for (uint32_t i = 0; i < a.Length(); i++) {
          View v = hold(op, a.Get(i), name, "each buffer");
          op->bufs.push_back(uvccl_buf_t{v.data, v.len});
        }
      }
      Op *o = op;
      op = nullptr;
      rc = uvccl_scatter_bytes(pg, &o->work, at_root ? o->bufs.data() : nullptr,
                               at_root ? o->bufs.size() : 0, root, op_done);
      return started(o, rc, name);
    }
    View v;
    if (which != BYTES_BROADCAST || at_root) v = hold(op, info[0], name, "the buffer");
    Op *o = op;
    op = nullptr;
    switch (which) {
    case BYTES_BROADCAST:
      rc = uvccl_broadcast_bytes(pg, &o->work, v.data, v.len, root, op_done);
      break;
    case BYTES_ALLGATHER:
      rc = uvccl_allgather_bytes(pg, &o->work, v.data, v.len, op_done);
      break;
    default:
      rc = uvccl_gather_bytes(pg, &o->work, v.data, v.len, root, op_done);
    }
    return started(o, rc, name);
  });
}

// premulSum(factor) -> a reduce op of this group: sum of each input times
// factor (c10d's _make_nccl_premul_sum)
Napi::Value Group::PremulSum(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  uvccl_pg_t *pg = Ready(env, "premulSum");
  if (!info[0].IsNumber()) throw Napi::TypeError::New(env, "premulSum: a factor");
  uvccl_redop_t op;
  int rc = uvccl_pg_premul_sum(pg, info[0].As<Napi::Number>().DoubleValue(), &op);
  if (rc < 0) throw_status(env, rc, "premulSum", nullptr, pg);
  return Napi::Number::New(env, static_cast<double>(op));
}

// barrier(timeout)
Napi::Value Group::Barrier(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  Op *op = nullptr;
  return guarded(env, &op, "barrier", [&]() -> Napi::Value {
    uvccl_pg_t *pg = Ready(env, "barrier");
    uint64_t to = timeout_of(info[0]);
    Op *o = group_op(this, info, RES_NONE);
    o->work.timeout_ms = to;
    return started(o, uvccl_barrier(pg, &o->work, op_done), "barrier");
  });
}

// monitoredBarrier(waitAll, timeout)
Napi::Value Group::MonitoredBarrier(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  Op *op = nullptr;
  return guarded(env, &op, "monitoredBarrier", [&]() -> Napi::Value {
    uvccl_pg_t *pg = Ready(env, "monitoredBarrier");
    uint64_t to = timeout_of(info[1]);
    Op *o = group_op(this, info, RES_NONE);
    o->work.timeout_ms = to;
    return started(o, uvccl_monitored_barrier(pg, &o->work, info[0].ToBoolean(),
                                              op_done),
                   "monitoredBarrier");
  });
}

// send(buffer, dst, tag, timeout) and recv(buffer, src, tag, timeout) ->
// {source, length}; src -1: any
Napi::Value Group::Send(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  Op *op = nullptr;
  return guarded(env, &op, "send", [&]() -> Napi::Value {
    uvccl_pg_t *pg = Ready(env, "send");
    if (!info[1].IsNumber())
      throw Napi::TypeError::New(env, "send: dst must be a rank");
    op = group_op(this, info, RES_NONE);
    View v = hold(op, info[0], "send", "the buffer");
    op->work.timeout_ms = timeout_of(info[3]);
    Op *o = op;
    op = nullptr;
    return started(o, uvccl_send(pg, &o->work, v.data, v.len, int_arg(info, 1, 0),
                                 int_arg(info, 2, 0), op_done),
                   "send");
  });
}

Napi::Value Group::Recv(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  Op *op = nullptr;
  return guarded(env, &op, "recv", [&]() -> Napi::Value {
    uvccl_pg_t *pg = Ready(env, "recv");
    op = group_op(this, info, RES_RECV);
    View v = hold(op, info[0], "recv", "the buffer");
    op->work.timeout_ms = timeout_of(info[3]);
    Op *o = op;
    op = nullptr;
    return started(o, uvccl_recv(pg, &o->work, v.data, v.len, int_arg(info, 1, -1),
                                 int_arg(info, 2, 0), op_done),
                   "recv");
  });
}

// split(color, key) -> a group, or null where color < 0
Napi::Value Group::Split(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  Op *op = nullptr;
  return guarded(env, &op, "split", [&]() -> Napi::Value {
    uvccl_pg_t *pg = Ready(env, "split");
    if (!info[0].IsNumber())
      throw Napi::TypeError::New(env, "split: color must be an integer");
    Group *g;
    Napi::Object made = Make(env, &g);
    op = group_op(this, info, RES_GROUP);
    op->made = Napi::Persistent(made);
    op->made_group = g;
    Op *o = op;
    op = nullptr;
    return started(o, uvccl_pg_split(pg, &g->box->pg, int_arg(info, 0, 0),
                                     int_arg(info, 1, pg->rank), &o->work, op_done),
                   "split");
  });
}

static std::vector<int> ranks_of(Napi::Env env, Napi::Value v, const char *opname) {
  if (!v.IsArray())
    throw Napi::TypeError::New(env, std::string(opname) + ": ranks must be an array");
  Napi::Array a = v.As<Napi::Array>();
  std::vector<int> r;
  for (uint32_t i = 0; i < a.Length(); i++) {
    Napi::Value e = a.Get(i);
    if (!e.IsNumber())
      throw Napi::TypeError::New(env, std::string(opname) + ": ranks[" +
                                          std::to_string(i) + "] is not a number");
    r.push_back(e.As<Napi::Number>().Int32Value());
  }
  return r;
}

// shrink(exclude) -> the group of the survivors (exclude: [] = the failed)
Napi::Value Group::Shrink(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  Op *op = nullptr;
  return guarded(env, &op, "shrink", [&]() -> Napi::Value {
    uvccl_pg_t *pg = Ready(env, "shrink");
    std::vector<int> excl = absent(info[0]) ? std::vector<int>()
                                            : ranks_of(env, info[0], "shrink");
    Group *g;
    Napi::Object made = Make(env, &g);
    op = group_op(this, info, RES_GROUP);
    op->made = Napi::Persistent(made);
    op->made_group = g;
    op->ranks = excl;
    Op *o = op;
    op = nullptr;
    int rc = excl.empty()
                 ? uvccl_pg_shrink(pg, &g->box->pg, &o->work, op_done)
                 : uvccl_pg_shrink_excluding(pg, &g->box->pg, o->ranks.data(),
                                             static_cast<int>(o->ranks.size()),
                                             &o->work, op_done);
    return started(o, rc, "shrink");
  });
}

// newGroup(ranks, tag) -> a group, or null where this rank is not in it.
// Local: every rank of this group calls it, in the same order.
Napi::Value Group::NewGroup(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  uvccl_pg_t *pg = Ready(env, "newGroup");
  std::vector<int> ranks = ranks_of(env, info[0], "newGroup");
  std::string tag = str_or(info[1], "");
  Group *g;
  Napi::Object made = Make(env, &g);
  int rc = uvccl_pg_new_group(pg, &g->box->pg, ranks.data(),
                              static_cast<int>(ranks.size()),
                              tag.empty() ? nullptr : tag.c_str());
  if (rc == UVCCL_ENOTMEMBER) {
    g->Created(UVCCL_ENOTMEMBER);
    return env.Null();
  }
  if (rc < 0) {
    g->Created(UVCCL_ENOTMEMBER); // nothing was made
    throw_status(env, rc, "newGroup", nullptr, pg);
  }
  g->box->live = true;
  g->Created(0);
  return made;
}

Napi::Value Group::Revoke(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  uvccl_pg_t *pg = Ready(env, "revoke");
  std::string reason = str_or(info[0], "");
  int rc = uvccl_pg_revoke(pg, reason.empty() ? nullptr : reason.c_str());
  if (rc < 0) throw_status(env, rc, "revoke", nullptr, pg);
  return env.Undefined();
}

Napi::Value Group::Abort(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  uvccl_pg_t *pg = Ready(env, "abort");
  std::string reason = str_or(info[0], "");
  uvccl_pg_abort(pg, reason.empty() ? nullptr : reason.c_str());
  return env.Undefined();
}

// destroy() -> a Promise settled once the connections are closed
Napi::Value Group::Destroy(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  Napi::Promise::Deferred d = Napi::Promise::Deferred::New(env);
  if (state != READY) {
    d.Resolve(env.Undefined());
    return d.Promise();
  }
  state = GONE;
  PgBox *b = box;
  b->closed = new Napi::Promise::Deferred(d);
  box = nullptr;
  b->owner = nullptr;
  close_box(b);
  return d.Promise();
}

Napi::Value Group::Failure(const Napi::CallbackInfo &info) {
  return failure_of(info.Env(), pg());
}

Napi::Value Group::GlobalRank(const Napi::CallbackInfo &info) {
  uvccl_pg_t *pg = Ready(info.Env(), "globalRank");
  return Napi::Number::New(info.Env(), uvccl_pg_global_rank(pg, int_arg(info, 0, 0)));
}

Napi::Value Group::PeerTransport(const Napi::CallbackInfo &info) {
  uvccl_pg_t *pg = Ready(info.Env(), "peerTransport");
  return Napi::String::New(info.Env(), uvccl_pg_peer_transport(pg, int_arg(info, 0, 0)));
}

Napi::Value Group::SetTimeout(const Napi::CallbackInfo &info) {
  uvccl_pg_t *pg = Ready(info.Env(), "setTimeout");
  uvccl_pg_set_timeout(pg, timeout_of(info[0]));
  return info.Env().Undefined();
}

void init_group(Napi::Env env, Napi::Object exports) {
  Napi::Function ctor = Group::Define(env);
  addon_of(env)->group_ctor = Napi::Persistent(ctor);
  exports.Set("CoreGroup", ctor);
}

} // namespace uvccl_node
