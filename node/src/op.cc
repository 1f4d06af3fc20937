// Operations and their Promises, buffers and dtypes, errors.
#include <cstring>

#include "addon.h"
#include "group.h"

namespace uvccl_node {

Addon *addon_of(Napi::Env env) { return env.GetInstanceData<Addon>(); }

Op::Op(Napi::Env e, Napi::Object own, Result r)
    : env(e), deferred(Napi::Promise::Deferred::New(e)), result(r), addon(addon_of(e)) {
  work.data = this;
  if (!own.IsEmpty()) owner = Napi::Persistent(own);
  addon->ref();
}

Op::Op(Napi::Env e, Group *g, Result r)
    : env(e), deferred(Napi::Promise::Deferred::New(e)), group(g), result(r),
      addon(addon_of(e)) {
  work.data = this;
  g->Hold();
  addon->ref();
}

Op::~Op() {
  if (group != nullptr && !addon->gone) group->Release();
  addon->unref();
}

void Op::Abandon() {
  owner.SuppressDestruct();
  made.SuppressDestruct();
  for (auto &h : held) h.SuppressDestruct();
  group = nullptr;
  made_group = nullptr;
}

// ---- boxes -----------------------------------------------------------------

Box::Box(Napi::Env e) : addon(addon_of(e)), env(e) {
  addon->ref();
  addon->boxes.push_back(this);
}

Box::~Box() {
  for (size_t i = 0; i < addon->boxes.size(); i++)
    if (addon->boxes[i] == this) {
      addon->boxes[i] = addon->boxes.back();
      addon->boxes.pop_back();
      break;
    }
  addon->unref();
}

void close_box(Box *box) {
  if (!box->live || box->closing) return;
  box->closing = true;
  if (box->owner != nullptr) {
    box->Orphan();
    box->owner = nullptr;
  }
  box->Close();
}

void close_done(Box *box) {
  Addon *a = box->addon;
  Napi::Promise::Deferred *d = box->closed;
  bool counted = a->hook != nullptr;
  a->ref();
  delete box;
  if (d != nullptr) {
    if (!a->gone) {
      Napi::Env env(d->Env());
      Napi::HandleScope hs(env);
      Napi::CallbackScope cs(env, *a->context);
      Napi::Promise::Deferred settle = *d;
      delete d;
      settle.Resolve(env.Undefined());
    } else {
      delete d; // (its promise is gone with the environment)
    }
  }
  if (counted && --a->hook_closing == 0) {
    napi_remove_async_cleanup_hook(a->hook);
    a->hook = nullptr;
    a->refs--; // the hook's (this call holds one more)
  }
  a->unref();
}

// ---- errors ----------------------------------------------------------------

Napi::Value failure_of(Napi::Env env, const uvccl_pg_t *pg) {
  uvccl_pg_failure_t f;
  int ranks[64];
  if (pg == nullptr || uvccl_pg_get_failure(pg, &f) != 1) return env.Null();
  int n = uvccl_pg_failed_ranks(pg, ranks, 64);
  if (n > 64) n = 64;
  Napi::Array failed = Napi::Array::New(env, n > 0 ? n : 0);
  for (int i = 0; i < n; i++) failed.Set(i, ranks[i]);
  Napi::Object o = Napi::Object::New(env);
  o.Set("cause", uvccl_fail_cause_name(f.cause));
  o.Set("rank", f.rank);
  o.Set("globalRank", f.global_rank);
  o.Set("reporter", f.reporter);
  o.Set("err", f.err);
  o.Set("address", f.address);
  o.Set("message", f.msg);
  o.Set("hostLost", Napi::Boolean::New(env, f.host_lost != 0));
  o.Set("failedRanks", failed);
  return o;
}

Napi::Value make_error(Napi::Env env, int status, const char *msg,
                       const uvccl_pg_t *pg) {
  Addon *a = addon_of(env);
  Napi::Value failure = status == UVCCL_EPEER || status == UVCCL_EREVOKED
                            ? failure_of(env, pg)
                            : env.Null();
  if (a == nullptr || a->error_factory.IsEmpty())
    return Napi::Error::New(env, msg).Value();
  return a->error_factory.Call(
      {Napi::Number::New(env, status), Napi::String::New(env, msg), failure});
}

static std::string line_of(int status, const char *op, const char *msg) {
  if (msg != nullptr && msg[0] != '\0') return msg;
  return std::string(op) + ": " + uvccl_strerror(status);
}

void throw_status(Napi::Env env, int status, const char *op, const char *msg,
                  const uvccl_pg_t *pg) {
  throw Napi::Error(env, make_error(env, status,
                                    line_of(status, op, msg).c_str(), pg));
}

// ---- settling --------------------------------------------------------------

void settle(Napi::Env env, Napi::Promise::Deferred &d, int status,
            const char *msg, Napi::Value value, const uvccl_pg_t *pg) {
  if (status == 0)
    d.Resolve(value.IsEmpty() ? env.Undefined() : value);
  else
    d.Reject(make_error(env, status, msg, pg));
}

static const uvccl_pg_t *owner_pg(Op *op) {
  return op->group != nullptr ? op->group->pg() : nullptr;
}

// A uv callback: no JS frame is below, so the settle runs in a callback
// scope of its own (its microtasks, the awaiting code, run as it closes).
void op_done(uvccl_work_t *w, int status) {
  Op *op = static_cast<Op *>(w->data);
  if (op->addon->gone) { // the environment is being torn down: no N-API
    // (a group it made is in the addon's boxes: the teardown closes it)
    uvccl_work_cleanup(w);
    op->Abandon();
    delete op;
    return;
  }
  Napi::Env env(op->env);
  Napi::HandleScope hs(env);
  Addon *a = addon_of(env);
  Napi::CallbackScope cs(env, *a->context);
  Napi::Value value;
  const uvccl_pg_t *pg = owner_pg(op);
  if (status == 0) {
    switch (op->result) {
    case RES_VALUE:
      value = Napi::Buffer<char>::Copy(env, static_cast<char *>(w->value),
                                       w->value_len);
      break;
    case RES_RESULT:
      value = Napi::Number::New(env, static_cast<double>(w->result));
      break;
    case RES_BOOL:
      value = Napi::Boolean::New(env, w->result != 0);
      break;
    case RES_VALUES: // work->values, one Buffer each; null where none came
      if (w->nvalues == 0) {
        value = env.Null();
      } else {
        Napi::Array a = Napi::Array::New(env, w->nvalues);
        for (size_t i = 0; i < w->nvalues; i++)
          a.Set(static_cast<uint32_t>(i),
                Napi::Buffer<char>::Copy(env, static_cast<char *>(w->values[i].base),
                                         w->values[i].len));
        value = a;
      }
      break;
    case RES_KEYS: {
      Napi::Array a = Napi::Array::New(env, w->nvalues);
      for (size_t i = 0; i < w->nvalues; i++)
        a.Set(static_cast<uint32_t>(i),
              Napi::String::New(env, static_cast<const char *>(w->values[i].base)));
      value = a;
      break;
    }
    case RES_BATCH: { // one entry an op: {source, length} for receives
      Napi::Array a = Napi::Array::New(env, op->p2p.size());
      for (size_t i = 0; i < op->p2p.size(); i++) {
        if (op->p2p[i].is_send) {
          a.Set(static_cast<uint32_t>(i), env.Null());
          continue;
        }
        Napi::Object o = Napi::Object::New(env);
        o.Set("source", op->p2p[i].source);
        o.Set("length", Napi::Number::New(env, static_cast<double>(op->p2p[i].received)));
        a.Set(static_cast<uint32_t>(i), o);
      }
      value = a;
      break;
    }
    case RES_RECV: {
      Napi::Object o = Napi::Object::New(env);
      o.Set("source", Napi::Number::New(env, static_cast<double>(w->result)));
      o.Set("length", Napi::Number::New(env, static_cast<double>(w->value_len)));
      value = o;
      break;
    }
    case RES_GROUP:
      op->made_group->Created(0);
      value = op->made.Value();
      break;
    case RES_HELD: // the output; null where this rank has none
      value = op->value_at < 0 ? env.Null() : op->held[op->value_at].Value();
      break;
    default:
      value = env.Undefined();
    }
  } else if (op->made_group != nullptr) {
    op->made_group->Created(status);
    if (status == UVCCL_ENOTMEMBER) { // a split that leaves this rank out
      status = 0;
      value = env.Null();
    }
  }
  Napi::Promise::Deferred d = op->deferred;
  std::string msg = w->msg;
  uvccl_work_cleanup(w);
  delete op; // before any JS runs: it may start the next operation
  try {
    settle(env, d, status, msg.c_str(), value, pg);
  } catch (const Napi::Error &e) {
    // only when the environment is going away
  }
}

Napi::Value started(Op *op, int rc, const char *name) {
  Napi::Env env(op->env);
  Napi::Promise promise = op->deferred.Promise();
  if (rc >= 0 && op->made_group != nullptr && op->made_group->box != nullptr) {
    PgBox *b = op->made_group->box;
    b->pg.data = static_cast<Box *>(b);
    b->live = true; // destroyable from here on, creation or not
  }
  if (rc < 0) {
    if (op->made_group != nullptr) op->made_group->Created(UVCCL_ENOTMEMBER);
    op->work.state = UVCCL_WORK_IDLE;
    std::string line = line_of(rc, name, op->work.msg);
    Napi::Value err = make_error(env, rc, line.c_str(), owner_pg(op));
    op->deferred.Reject(err);
    delete op;
  }
  return promise;
}

Napi::Value rejected(Napi::Env env, const Napi::Error &e) {
  Napi::Promise::Deferred d = Napi::Promise::Deferred::New(env);
  d.Reject(e.Value());
  return d.Promise();
}

// (a Deferred is freed only when settled: the op's own rejects)
Napi::Value rejected(Op *op, const Napi::Error &e) {
  if (op == nullptr) return rejected(e.Env(), e);
  Napi::Promise p = op->deferred.Promise();
  op->deferred.Reject(e.Value());
  delete op;
  return p;
}

// ---- buffers and dtypes ----------------------------------------------------

static int dtype_of_typed(napi_typedarray_type t) {
  switch (t) {
  case napi_int8_array: return UVCCL_INT8;
  case napi_uint8_array:
  case napi_uint8_clamped_array: return UVCCL_UINT8;
  case napi_int32_array: return UVCCL_INT32;
  case napi_float32_array: return UVCCL_FLOAT32;
  case napi_float64_array: return UVCCL_FLOAT64;
  case napi_bigint64_array: return UVCCL_INT64;
  default: return -1; // (u)int16, uint32, biguint64: no uvccl dtype
  }
}

static const char *typed_name(napi_typedarray_type t) {
  switch (t) {
  case napi_int8_array: return "Int8Array";
  case napi_uint8_array: return "Uint8Array";
  case napi_uint8_clamped_array: return "Uint8ClampedArray";
  case napi_int16_array: return "Int16Array";
  case napi_uint16_array: return "Uint16Array";
  case napi_int32_array: return "Int32Array";
  case napi_uint32_array: return "Uint32Array";
  case napi_float32_array: return "Float32Array";
  case napi_float64_array: return "Float64Array";
  case napi_bigint64_array: return "BigInt64Array";
  case napi_biguint64_array: return "BigUint64Array";
  default: return "TypedArray";
  }
}

View hold(Op *op, Napi::Value v, const char *opname, const char *what) {
  Napi::Env env(op->env);
  View out;
  if (v.IsTypedArray()) {
    Napi::TypedArray ta = v.As<Napi::TypedArray>();
    Napi::ArrayBuffer ab = ta.ArrayBuffer();
    out.data = static_cast<char *>(ab.Data()) + ta.ByteOffset();
    out.len = ta.ByteLength();
    out.dtype = dtype_of_typed(ta.TypedArrayType());
    out.type = typed_name(ta.TypedArrayType());
  } else if (v.IsDataView()) {
    Napi::DataView dv = v.As<Napi::DataView>();
    out.data = static_cast<char *>(dv.ArrayBuffer().Data()) + dv.ByteOffset();
    out.len = dv.ByteLength();
    out.type = "DataView";
  } else if (v.IsArrayBuffer()) {
    Napi::ArrayBuffer ab = v.As<Napi::ArrayBuffer>();
    out.data = ab.Data();
    out.len = ab.ByteLength();
  } else {
    throw Napi::TypeError::New(
        env, std::string(opname) + ": " + what +
                 " must be a TypedArray, Buffer, DataView or ArrayBuffer");
  }
  if (out.data == nullptr && out.len > 0)
    throw Napi::TypeError::New(env, std::string(opname) + ": " + what +
                                        " has no memory (detached?)");
  op->held.push_back(Napi::Persistent(v));
  return out;
}

size_t dtype_of(Napi::Env env, const View &v, const std::string &dtname,
                bool moving, const char *opname, uvccl_dtype_t *dt) {
  if (!dtname.empty()) {
    if (uvccl_dtype_from_name(dtname.c_str(), dt) < 0)
      throw Napi::RangeError::New(env, std::string(opname) +
                                           ": unknown dtype '" + dtname + "'");
  } else if (v.dtype >= 0) {
    *dt = static_cast<uvccl_dtype_t>(v.dtype);
  } else if (moving) {
    *dt = UVCCL_UINT8;
  } else {
    throw Napi::TypeError::New(
        env, std::string(opname) + ": " + v.type +
                 " cannot be reduced; uvccl reduces "
                 "Int8Array, Uint8Array (and Buffer), Int32Array, "
                 "BigInt64Array, Float32Array, Float64Array, and with "
                 "{dtype} float16, bfloat16 (Uint16Array), bool, complex64, "
                 "complex128");
  }
  size_t es = uvccl_dtype_size(*dt);
  if (es == 0 || v.len % es != 0)
    throw Napi::RangeError::New(
        env, std::string(opname) + ": a buffer of " + std::to_string(v.len) +
                 " bytes is not a whole number of " + uvccl_dtype_name(*dt) +
                 " elements");
  return v.len / es;
}

// A reduce op: its name, or a number (an op of the group's, from
// premulSum()); undefined: sum.
uvccl_redop_t redop_of(Napi::Env env, Napi::Value v, const char *opname) {
  uvccl_redop_t op;
  if (v.IsNumber()) return static_cast<uvccl_redop_t>(v.As<Napi::Number>().Int32Value());
  std::string name = str_or(v, "sum");
  if (uvccl_redop_from_name(name.c_str(), &op) < 0 || op == UVCCL_PREMUL_SUM)
    throw Napi::RangeError::New(
        env, std::string(opname) + ": unknown reduce op '" + name +
                 "' (sum, avg, product, min, max, band, bor, bxor, or "
                 "premulSum(factor)'s)");
  return op;
}

uint64_t timeout_of(Napi::Value v) {
  if (v.IsUndefined() || v.IsNull()) return 0;
  double ms = v.IsNumber() ? v.As<Napi::Number>().DoubleValue() : -1;
  if (!(ms >= 0) || ms > 1e15)
    throw Napi::RangeError::New(v.Env(), "timeout: milliseconds, a number not "
                                         "negative (0: the default)");
  return static_cast<uint64_t>(ms + 0.5);
}

std::string str_or(Napi::Value v, const char *dflt) {
  if (v.IsString()) return v.As<Napi::String>().Utf8Value();
  return dflt;
}

} // namespace uvccl_node
