// uvccl as a PyTorch c10d backend (PyTorch 1.13's ProcessGroup API, 2.x's Backend API).
//
// One libuv loop per process, on a thread of this extension: PyTorch's
// calls (any thread) post operations to it through a uv_async_t; uvccl
// completes them there, and the c10d Work objects they return are finished
// from uvccl's callbacks (wait() and get_future() see the result, an error
// becomes a RuntimeError carrying uvccl's message).
//
// Bootstrap: whatever store PyTorch hands the backend (TCPStore, FileStore,
// HashStore, each inside a PrefixStore), rank 0 starts a uvccl store server
// on this loop and publishes its address there ("uvccl/server"); every rank
// then makes the uvccl group through that server. The c10d store is only
// used for that one key: its kind does not matter, and the group's own
// rendezvous runs on the loop, never blocking on a c10d store.
#include <torch/python.h>
#include <torch/version.h>
#if TORCH_VERSION_MAJOR >= 2
// PyTorch 2: a process group holds one Backend per device type; this is
// the CPU one.
#include <torch/csrc/distributed/c10d/Backend.hpp>
#define UVCCL_TORCH2 1
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <pybind11/chrono.h>

#include <uvccl.h>

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace uvccl_torch {

#ifdef UVCCL_TORCH2
using PGBase = c10d::Backend;
#else
using PGBase = c10d::ProcessGroup;
#endif

// ---- the loop thread ---------------------------------------------------------

class Loop {
 public:
  static std::shared_ptr<Loop> get() {
    static std::mutex mu;
    static std::weak_ptr<Loop> current;
    std::lock_guard<std::mutex> g(mu);
    auto l = current.lock();
    if (!l) {
      l = std::shared_ptr<Loop>(new Loop());
      current = l;
    }
    return l;
  }

  ~Loop() {
    // the last task: with the async handle closed the loop runs dry
    post([this] { uv_close(reinterpret_cast<uv_handle_t*>(&async_), nullptr); });
    thread_.join();
    uv_loop_close(&loop_);
  }

  uv_loop_t* loop() { return &loop_; }

  // Runs fn on the loop thread, in the order posted.
  void post(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> g(mu_);
      tasks_.push_back(std::move(fn));
    }
    uv_async_send(&async_);
  }

  // Runs fn there and waits for it.
  template <typename T>
  T call(std::function<T()> fn) {
    std::promise<T> p;
    auto f = p.get_future();
    post([&] {
      try {
        p.set_value(fn());
      } catch (...) {
        p.set_exception(std::current_exception());
      }
    });
    return f.get();
  }

 private:
  Loop() {
    if (uv_loop_init(&loop_) != 0) throw std::runtime_error("uv_loop_init");
    uv_async_init(&loop_, &async_, on_async);
    async_.data = this;
    thread_ = std::thread([this] { uv_run(&loop_, UV_RUN_DEFAULT); });
  }

  static void on_async(uv_async_t* a) {
    auto* self = static_cast<Loop*>(a->data);
    std::deque<std::function<void()>> run;
    {
      std::lock_guard<std::mutex> g(self->mu_);
      run.swap(self->tasks_);
    }
    for (auto& fn : run) fn();
  }

  uv_loop_t loop_;
  uv_async_t async_;
  std::thread thread_;
  std::mutex mu_;
  std::deque<std::function<void()>> tasks_;
};

// ---- types -------------------------------------------------------------------

static uvccl_dtype_t dtype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kChar: return UVCCL_INT8;
    case at::kByte: return UVCCL_UINT8;
    case at::kBool: return UVCCL_BOOL;
    case at::kInt: return UVCCL_INT32;
    case at::kLong: return UVCCL_INT64;
    case at::kHalf: return UVCCL_FLOAT16;
    case at::kBFloat16: return UVCCL_BFLOAT16;
    case at::kFloat: return UVCCL_FLOAT32;
    case at::kDouble: return UVCCL_FLOAT64;
    case at::kComplexFloat: return UVCCL_COMPLEX64;
    case at::kComplexDouble: return UVCCL_COMPLEX128;
    default: break;
  }
  TORCH_CHECK(false, "uvccl: tensors of type ", t.scalar_type(),
              " are not supported");
}

// A c10d ReduceOp: uvccl's op, or PREMUL_SUM with its factor (made into a
// group's operation id on the loop: see ProcessGroupUVCCL::redop).
struct Redop {
  uvccl_redop_t op = UVCCL_SUM;
  bool premul = false;
  double factor = 1.0;
};

static Redop redop_of(const c10d::ReduceOp& rop) {
  Redop r;
  switch (rop.op_) {
    case c10d::ReduceOp::SUM: r.op = UVCCL_SUM; return r;
    case c10d::ReduceOp::AVG: r.op = UVCCL_AVG; return r;
    case c10d::ReduceOp::PRODUCT: r.op = UVCCL_PRODUCT; return r;
    case c10d::ReduceOp::MIN: r.op = UVCCL_MIN; return r;
    case c10d::ReduceOp::MAX: r.op = UVCCL_MAX; return r;
    case c10d::ReduceOp::BAND: r.op = UVCCL_BAND; return r;
    case c10d::ReduceOp::BOR: r.op = UVCCL_BOR; return r;
    case c10d::ReduceOp::BXOR: r.op = UVCCL_BXOR; return r;
    case c10d::ReduceOp::PREMUL_SUM: {
      auto* sup = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(
          rop.supplement_.get());
      TORCH_CHECK(sup != nullptr, "uvccl: PREMUL_SUM without its factor");
      r.op = UVCCL_PREMUL_SUM;
      r.premul = true;
#ifdef UVCCL_TORCH2
      const at::Tensor* f =
          sup->tensor_factor.defined() ? &sup->tensor_factor : nullptr;
#else
      const at::Tensor* f =
          sup->tensor_factors.empty() ? nullptr : &sup->tensor_factors[0];
#endif
      if (f != nullptr) {
        TORCH_CHECK(f->numel() == 1,
                    "uvccl: PREMUL_SUM: the factor tensor must hold one value");
        r.factor = f->item<double>();
      } else {
        r.factor = sup->double_factor;
      }
      return r;
    }
    default: break;
  }
  TORCH_CHECK(false, "uvccl: ReduceOp ", (int)rop.op_, " is not supported");
}

static void check_cpu(const at::Tensor& t, const char* op) {
  TORCH_CHECK(t.device().is_cpu(), "uvccl: ", op,
              ": only CPU tensors so far (got ", t.device(), ")");
  TORCH_CHECK(!t.is_sparse(), "uvccl: ", op, ": sparse tensors not yet");
}

static at::Tensor& single(std::vector<at::Tensor>& ts, const char* op) {
  TORCH_CHECK(ts.size() == 1, "uvccl: ", op, " takes one tensor per call, ",
              "got ", ts.size());
  check_cpu(ts[0], op);
  return ts[0];
}

// A tensor's bytes, as a flat uint8 tensor (a copy where not contiguous).
static at::Tensor bytes_of(const at::Tensor& t) {
  auto c = t.contiguous();
  return at::from_blob(c.data_ptr(), {(int64_t)c.nbytes()},
                       [c](void*) {}, at::kByte);
}

// flat (one dtype) back into the tensors it was made of, in order.
static void unflatten(const at::Tensor& flat, std::vector<at::Tensor>& ts) {
  int64_t off = 0;
  for (auto& o : ts) {
    o.copy_(flat.narrow(0, off, o.numel()).view(o.sizes()));
    off += o.numel();
  }
}

// flat bytes back into tensors of any dtypes, in order.
static void unflatten_bytes(const at::Tensor& flat,
                            std::vector<at::Tensor>& ts) {
  int64_t off = 0;
  for (auto& o : ts) {
    auto n = (int64_t)o.nbytes();
    auto piece = flat.narrow(0, off, n).clone();
    o.copy_(piece.view(o.scalar_type()).view(o.sizes()));
    off += n;
  }
}

static constexpr int kSparseMaxDims = 12;
static constexpr int kSparseMeta = 4 + kSparseMaxDims;

// ---- work --------------------------------------------------------------------

class WorkUVCCL;
static void on_done(uvccl_work_t* w, int status);

// A step of an operation: starts one uvccl call on w (returns its code).
using Step = std::function<int(uvccl_work_t* w)>;

class WorkUVCCL : public c10d::Work {
 public:
  WorkUVCCL(c10d::OpType type, const char* title,
            const std::vector<at::Tensor>& inputs,
            std::vector<at::Tensor> outputs)
      : c10d::Work(-1, type, title, inputs),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<at::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()))) {}

  std::vector<at::Tensor> keep;      // buffers alive until completion
  std::function<void()> after;       // copies back (non-contiguous outputs)
  std::deque<Step> steps;            // run one after another, on the loop
  uint64_t timeout_ms = 0;           // per-operation; 0: the group's
  int source_ = -1;   // recv from any source: the sender, once done

  // On the loop thread: starts the next step; false when there is none.
  // An error at the call completes the work.
  bool start_next() {
    if (steps.empty()) return false;
    Step st = std::move(steps.front());
    steps.pop_front();
    ws_.emplace_back(new uvccl_work_t);
    uvccl_work_t* w = ws_.back().get();
    std::memset(w, 0, sizeof(*w));
    w->data = this;
    w->timeout_ms = timeout_ms;
    int rc;
    try {
      rc = st(w);
    } catch (const std::exception& e) {
      complete_exc(std::current_exception());
      return true;
    }
    if (rc != 0) complete(rc, w->msg);
    return true;
  }

  // On the loop thread: the operation ended.
  void complete(int status, const char* msg) {
    if (status == 0) {
      try {
        if (after) after();
      } catch (...) {
        complete_exc(std::current_exception());
        return;
      }
      finish();
      future_->markCompleted(c10::IValue(outputs_));
    } else {
      // c10d's own wording for a timeout follows uvccl's account (scripts
      // and PyTorch's tests look for it)
      complete_exc(std::make_exception_ptr(std::runtime_error(
          std::string("uvccl: ") +
          (msg && *msg ? msg : uvccl_strerror(status)) + " (" +
          uvccl_err_name(status) +
          (status == UV_ETIMEDOUT ? ": the operation's timeout expired" : "") +
          ")")));
    }
  }

  void complete_exc(std::exception_ptr e) {
    finish(e);
    future_->setError(e);
    keep.clear();
    steps.clear();
    after = nullptr;
  }

  std::vector<at::Tensor> result() override { return outputs_; }
  int sourceRank() const override {
    TORCH_CHECK(source_ >= 0, "uvccl: sourceRank() is for recv_anysource");
    return source_;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    return future_;
  }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<at::ivalue::Future> future_;
  std::vector<std::unique_ptr<uvccl_work_t>> ws_;
};

static void on_done(uvccl_work_t* w, int status) {
  auto* work = static_cast<WorkUVCCL*>(w->data);
  if (status == 0 && work->source_ == -2) work->source_ = (int)w->result;
  if (status != 0) {
    work->complete(status, w->msg);
  } else if (!work->start_next()) {
    work->complete(0, nullptr);
  } else if (!work->isCompleted()) {
    return;  // the next step is under way: the loop keeps its reference
  }
  work->keep.clear();
  c10::raw::intrusive_ptr::decref(work);  // the loop's reference
}

// ---- the process group -------------------------------------------------------

class ProcessGroupUVCCL : public PGBase {
 public:
  ProcessGroupUVCCL(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                    int size, std::chrono::milliseconds timeout,
                    std::string name = "uvccl")
      : PGBase(rank, size),
        loop_(Loop::get()),
        name_(std::move(name)) {
    std::memset(&pg_, 0, sizeof(pg_));
    std::memset(&mb_pg_, 0, sizeof(mb_pg_));
    std::memset(&store_, 0, sizeof(store_));
    std::memset(&server_, 0, sizeof(server_));
    timeout_ms_ = (uint64_t)timeout.count();
    std::string addr;
    if (rank == 0) {
      std::string bind = publish_host();
      int port = loop_->call<int>([this, &bind]() {
        uvccl_store_server_options_t so;
        std::memset(&so, 0, sizeof(so));
        so.listen_fd = -1;
        // the address the ranks are told, not every interface (a job on
        // loopback is reachable from this host only); every interface
        // only where that address cannot be bound here
        so.host = bind.c_str();
        int rc = uvccl_store_server_init(loop_->loop(), &server_, &so);
        if (rc == UV_EADDRNOTAVAIL || rc == UV_EAI_NONAME) {
          so.host = nullptr;
          rc = uvccl_store_server_init(loop_->loop(), &server_, &so);
        }
        TORCH_CHECK(rc == 0, "uvccl: starting the store server: ",
                    uvccl_strerror(rc));
        has_server_ = true;
        return server_.port;
      });
      addr = publish_host() + ":" + std::to_string(port);
      store->set("uvccl/server", std::vector<uint8_t>(addr.begin(), addr.end()));
    } else {
      auto v = store->get("uvccl/server");
      addr.assign(v.begin(), v.end());
    }
    auto colon = addr.rfind(':');
    TORCH_CHECK(colon != std::string::npos, "uvccl: bad server address '",
                addr, "'");
    host_ = addr.substr(0, colon);
    int port = std::stoi(addr.substr(colon + 1));
    std::string msg = loop_->call<std::string>([this, port, rank, size]() {
      uvccl_tcp_store_options_t to;
      std::memset(&to, 0, sizeof(to));
      to.host = host_.c_str();
      to.port = port;
      to.timeout_ms = timeout_ms_;
      int rc = uvccl_tcp_store_init(loop_->loop(), &store_, &to);
      if (rc != 0) return std::string("store client: ") + uvccl_strerror(rc);
      has_store_ = true;
      uvccl_pg_options_t o;
      std::memset(&o, 0, sizeof(o));
      o.rank = rank;
      o.size = size;
      o.timeout_ms = timeout_ms_;
      std::memset(&init_w_, 0, sizeof(init_w_));
      init_w_.data = this;
      rc = uvccl_pg_init(loop_->loop(), &pg_, &store_, &o, &init_w_,
                         [](uvccl_work_t* w, int status) {
                           auto* self = static_cast<ProcessGroupUVCCL*>(w->data);
                           std::lock_guard<std::mutex> g(self->init_mu_);
                           self->init_status_ = status;
                           self->init_msg_ = w->msg;
                           self->init_done_ = true;
                           self->init_cv_.notify_all();
                         });
      if (rc != 0) return std::string("uvccl_pg_init: ") + uvccl_strerror(rc);
      return std::string();
    });
    if (!msg.empty()) {
      shutdown();
      TORCH_CHECK(false, "uvccl: ", msg);
    }
    std::unique_lock<std::mutex> g(init_mu_);
    init_cv_.wait(g, [this] { return init_done_; });
    if (init_status_ != 0) {
      std::string m = init_msg_;
      g.unlock();
      shutdown();
      TORCH_CHECK(false, "uvccl: creating the group: ", m);
    }
    // the private subgroup of monitoredBarrier: every rank makes it now,
    // in the same place, as uvccl_pg_new_group asks
    std::vector<int> all(size);
    for (int i = 0; i < size; i++) all[i] = i;
    int rc = loop_->call<int>([this, &all, size]() {
      return uvccl_pg_new_group(&pg_, &mb_pg_, all.data(), size, nullptr);
    });
    if (rc != 0) {
      shutdown();
      TORCH_CHECK(false, "uvccl: creating the group: ", uvccl_strerror(rc));
    }
    pg_up_ = true;
  }

  ~ProcessGroupUVCCL() override { shutdown(); }

  const std::string getBackendName() const override { return name_; }

  // Fails every pending operation of the group at once, here and (with
  // the reason) on every other rank; the group is unusable after (destroy
  // it). For an application that must stop a stuck job without waiting
  // for its timeouts.
  void abort(const std::string& reason) {
    loop_->call<int>([this, reason]() {
      if (pg_up_) uvccl_pg_abort(&pg_, reason.c_str());
      return 0;
    });
  }

  // c10d's per-group sequence number: every collective counts one (point-
  // to-point operations do not: they need not match across ranks). Groups
  // are made by all their ranks at once, so every rank starts at 0.
  void setSequenceNumberForGroup() override { seq_ = 0; }
  uint64_t getSequenceNumberForGroup() override { return seq_.load(); }

  // ---- collectives ----

  c10::intrusive_ptr<c10d::Work> broadcast(
      std::vector<at::Tensor>& tensors,
      const c10d::BroadcastOptions& opts) override {
    auto& t = single(tensors, "broadcast");
    auto buf = t.contiguous();
    auto work = make_work(c10d::OpType::BROADCAST, {t}, {t}, {buf}, t, buf);
    uvccl_dtype_t dt = dtype_of(t);
    int root = (int)opts.rootRank;
    return submit(work, [this, buf, dt, root](uvccl_work_t* w) {
      return uvccl_broadcast(&pg_, w, buf.data_ptr(), (size_t)buf.numel(), dt,
                             root, on_done);
    }, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts) override {
    if (tensors.size() == 1 && tensors[0].is_sparse())
      return sparse_sum(tensors[0], opts);
    auto& t = single(tensors, "allreduce");
    auto buf = t.contiguous();
    auto work = make_work(c10d::OpType::ALLREDUCE, {t}, {t}, {buf}, t, buf);
    uvccl_dtype_t dt = dtype_of(t);
    Redop op = redop_of(opts.reduceOp);
    return submit(work, [this, buf, dt, op](uvccl_work_t* w) {
      return uvccl_allreduce(&pg_, w, buf.data_ptr(), buf.data_ptr(),
                             (size_t)buf.numel(), dt, redop(op), on_done);
    }, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> reduce(
      std::vector<at::Tensor>& tensors,
      const c10d::ReduceOptions& opts) override {
    auto& t = single(tensors, "reduce");
    auto buf = t.contiguous();
    auto work = make_work(c10d::OpType::REDUCE, {t}, {t}, {buf}, t, buf);
    uvccl_dtype_t dt = dtype_of(t);
    Redop op = redop_of(opts.reduceOp);
    int root = (int)opts.rootRank;
    return submit(work, [this, buf, dt, op, root](uvccl_work_t* w) {
      return uvccl_reduce(&pg_, w, buf.data_ptr(), buf.data_ptr(),
                          (size_t)buf.numel(), dt, redop(op), root, on_done);
    }, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    auto& in = single(inputs, "allgather");
    TORCH_CHECK(outputs.size() == 1 && (int)outputs[0].size() == getSize(),
                "uvccl: allgather wants one list of ", getSize(),
                " output tensors");
    for (auto& o : outputs[0])
      TORCH_CHECK(o.numel() == in.numel() && o.scalar_type() == in.scalar_type(),
                  "uvccl: allgather: every output must match the input");
    auto src = in.contiguous();
    // one flat buffer, then the blocks go to the caller's tensors
    auto flat = at::empty({(int64_t)getSize() * in.numel()}, in.options());
    auto outs = outputs[0];
    auto work = make_work(c10d::OpType::ALLGATHER, {in}, outs, {src, flat});
    work->after = [outs, flat, n = in.numel()]() mutable {
      for (size_t i = 0; i < outs.size(); i++)
        outs[i].copy_(flat.narrow(0, (int64_t)i * n, n).view(outs[i].sizes()));
    };
    uvccl_dtype_t dt = dtype_of(in);
    return submit(work, [this, src, flat, dt](uvccl_work_t* w) {
      return uvccl_allgather(&pg_, w, src.data_ptr(), flat.data_ptr(),
                             (size_t)src.numel(), dt, on_done);
    }, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::AllgatherOptions& opts) override {
    check_cpu(input, "_allgather_base");
    check_cpu(output, "_allgather_base");
    TORCH_CHECK(output.numel() == input.numel() * getSize(),
                "uvccl: _allgather_base: the output must hold size x input");
    auto src = input.contiguous();
    auto dst = output.contiguous();
    auto work = make_work(c10d::OpType::_ALLGATHER_BASE, {input}, {output}, {src, dst},
                          output, dst);
    uvccl_dtype_t dt = dtype_of(input);
    return submit(work, [this, src, dst, dt](uvccl_work_t* w) {
      return uvccl_allgather(&pg_, w, src.data_ptr(), dst.data_ptr(),
                             (size_t)src.numel(), dt, on_done);
    }, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> barrier(
      const c10d::BarrierOptions& opts) override {
    auto work = make_work(c10d::OpType::BARRIER, {}, {}, {});
    return submit(work, [this](uvccl_work_t* w) {
      return uvccl_barrier(&pg_, w, on_done);
    }, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors,
                                      int dst, int tag) override {
    auto& t = single(tensors, "send");
    auto buf = t.contiguous();
    auto work = make_work(c10d::OpType::SEND, {t}, {t}, {buf});
    size_t n = (size_t)buf.nbytes();
    return submit(work, [this, buf, n, dst, tag](uvccl_work_t* w) {
      return uvccl_send(&pg_, w, buf.data_ptr(), n, dst, tag, on_done);
    });
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors,
                                      int src, int tag) override {
    auto& t = single(tensors, "recv");
    auto buf = t.contiguous();
    auto work = make_work(c10d::OpType::RECV, {t}, {t}, {buf}, t, buf);
    size_t n = (size_t)buf.nbytes();
    return submit(work, [this, buf, n, src, tag](uvccl_work_t* w) {
      return uvccl_recv(&pg_, w, buf.data_ptr(), n, src, tag, on_done);
    });
  }

  c10::intrusive_ptr<c10d::Work> recvAnysource(
      std::vector<at::Tensor>& tensors, int tag) override {
    auto& t = single(tensors, "recv");
    auto buf = t.contiguous();
    auto work = make_work(c10d::OpType::RECVANYSOURCE, {t}, {t}, {buf}, t, buf);
    work->source_ = -2;  // filled in by on_done
    size_t n = (size_t)buf.nbytes();
    return submit(work, [this, buf, n, tag](uvccl_work_t* w) {
      return uvccl_recv(&pg_, w, buf.data_ptr(), n, UVCCL_ANY_SOURCE, tag,
                        on_done);
    });
  }

  // One flat buffer per dtype: one operation each, then the pieces go back.
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts) override {
    TORCH_CHECK(!tensors.empty(), "uvccl: allreduce_coalesced: no tensors");
    for (auto& t : tensors) check_cpu(t, "allreduce_coalesced");
    Redop op = redop_of(opts.reduceOp);
    auto outs = tensors;
    auto work = make_work(c10d::OpType::ALLREDUCE_COALESCED, tensors, outs, {});
    std::vector<std::function<void()>> backs;
    std::vector<bool> done(tensors.size(), false);
    for (size_t i = 0; i < tensors.size(); i++) {
      if (done[i]) continue;
      std::vector<at::Tensor> same, flats;
      for (size_t j = i; j < tensors.size(); j++)
        if (!done[j] && tensors[j].scalar_type() == tensors[i].scalar_type()) {
          done[j] = true;
          same.push_back(tensors[j]);
          flats.push_back(tensors[j].reshape(-1));
        }
      auto flat = at::cat(flats);
      work->keep.push_back(flat);
      uvccl_dtype_t dt = dtype_of(flat);
      work->steps.push_back([this, flat, dt, op](uvccl_work_t* w) {
        return uvccl_allreduce(&pg_, w, flat.data_ptr(), flat.data_ptr(),
                               (size_t)flat.numel(), dt, redop(op), on_done);
      });
      backs.push_back([same, flat]() mutable { unflatten(flat, same); });
    }
    work->after = [backs]() {
      for (auto& b : backs) b();
    };
    return submit(work, nullptr, opts.timeout);
  }

  // Each rank's inputs as bytes, one allgather, then every rank's pieces
  // into output_lists[rank] (any mix of dtypes and shapes, the same on
  // every rank).
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& output_lists,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    TORCH_CHECK((int)output_lists.size() == getSize(),
                "uvccl: allgather_coalesced wants ", getSize(),
                " output lists");
    std::vector<at::Tensor> bytes;
    int64_t total = 0;
    for (auto& t : inputs) {
      check_cpu(t, "allgather_coalesced");
      bytes.push_back(bytes_of(t));
      total += (int64_t)t.nbytes();
    }
    for (auto& l : output_lists) {
      TORCH_CHECK(l.size() == inputs.size(),
                  "uvccl: allgather_coalesced: each output list must match "
                  "the inputs");
      for (size_t i = 0; i < l.size(); i++)
        TORCH_CHECK(l[i].numel() == inputs[i].numel() &&
                        l[i].scalar_type() == inputs[i].scalar_type(),
                    "uvccl: allgather_coalesced: output ", i,
                    " must match input ", i);
    }
    auto src = bytes.empty() ? at::empty({0}, at::kByte) : at::cat(bytes);
    auto flat = at::empty({total * getSize()}, at::kByte);
    std::vector<at::Tensor> outs;
    for (auto& l : output_lists) outs.insert(outs.end(), l.begin(), l.end());
    auto work = make_work(c10d::OpType::ALLGATHER_COALESCED, inputs, outs, {src, flat});
    auto lists = output_lists;
    work->after = [lists, flat, total]() mutable {
      for (size_t r = 0; r < lists.size(); r++)
        unflatten_bytes(flat.narrow(0, (int64_t)r * total, total), lists[r]);
    };
    return submit(work, [this, src, flat](uvccl_work_t* w) {
      return uvccl_allgather(&pg_, w, src.data_ptr(), flat.data_ptr(),
                             (size_t)src.numel(), UVCCL_UINT8, on_done);
    }, opts.timeout);
  }

  // Sparse SUM the way Gloo does it: each rank's coalesced indices and
  // values are allgathered (their counts first), and every rank adds them
  // up into one coalesced tensor, which replaces the input's contents.
#ifdef UVCCL_TORCH2
  // PyTorch 2 sends sparse tensors here
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts) override {
    TORCH_CHECK(tensors.size() == 1 && tensors[0].is_sparse(),
                "uvccl: allreduce_sparse takes one sparse tensor");
    return sparse_sum(tensors[0], opts);
  }
#endif

  c10::intrusive_ptr<c10d::Work> sparse_sum(
      at::Tensor& t, const c10d::AllreduceOptions& opts) {
    TORCH_CHECK(t.device().is_cpu(), "uvccl: sparse allreduce: CPU tensors");
    TORCH_CHECK(opts.reduceOp.op_ == c10d::ReduceOp::SUM,
                "uvccl: sparse allreduce supports SUM only");
    TORCH_CHECK(t.dim() <= kSparseMaxDims, "uvccl: sparse allreduce: at most ",
                kSparseMaxDims, " dimensions");
    struct State {
      at::Tensor in, meta, all_meta, idx, all_idx, val, all_val;
      std::vector<int64_t> nnz;            // each rank's entries
      std::vector<size_t> icounts, vcounts;
      std::vector<void*> iptrs, vptrs;
    };
    auto st = std::make_shared<State>();
    st->in = t.coalesce();
    st->idx = st->in._indices().contiguous();
    st->val = st->in._values().contiguous();
    // nnz, sparse dims, dense dims, dims, then the sizes
    st->meta = at::zeros({kSparseMeta}, at::kLong);
    auto m = st->meta.accessor<int64_t, 1>();
    m[0] = st->in._nnz();
    m[1] = st->in.sparse_dim();
    m[2] = st->in.dense_dim();
    m[3] = st->in.dim();
    for (int64_t d = 0; d < st->in.dim(); d++) m[4 + d] = st->in.size(d);
    st->all_meta = at::empty({kSparseMeta * getSize()}, at::kLong);
    uvccl_dtype_t vdt = dtype_of(st->val);
    auto out = t;
    auto work = make_work(c10d::OpType::ALLREDUCE, {t}, {t}, {});
    int n = getSize();
    work->steps.push_back([this, st](uvccl_work_t* w) {
      return uvccl_allgather(&pg_, w, st->meta.data_ptr(),
                             st->all_meta.data_ptr(), (size_t)kSparseMeta,
                             UVCCL_INT64, on_done);
    });
    work->steps.push_back([this, st, n](uvccl_work_t* w) {
      auto am = st->all_meta.accessor<int64_t, 1>();
      auto mine = st->meta.accessor<int64_t, 1>();
      int64_t itot = 0, vtot = 0;
      int64_t dense = 1;  // values per entry: the dense dimensions' sizes
      for (int64_t d = mine[1]; d < mine[3]; d++) dense *= mine[4 + d];
      for (int r = 0; r < n; r++) {
        for (int k = 1; k < kSparseMeta; k++)
          TORCH_CHECK(am[r * kSparseMeta + k] == mine[k],
                      "uvccl: sparse allreduce: rank ", r,
                      " has a tensor of another shape or layout");
        int64_t nnz = am[r * kSparseMeta];
        st->nnz.push_back(nnz);
        st->icounts.push_back((size_t)(nnz * mine[1]));
        st->vcounts.push_back((size_t)(nnz * dense));
        itot += nnz * mine[1];
        vtot += nnz * dense;
      }
      st->all_idx = at::empty({itot}, at::kLong);
      st->all_val = at::empty({vtot}, st->val.options());
      int64_t io = 0, vo = 0;
      for (int r = 0; r < n; r++) {
        st->iptrs.push_back(static_cast<int64_t*>(st->all_idx.data_ptr()) + io);
        st->vptrs.push_back(static_cast<char*>(st->all_val.data_ptr()) +
                            vo * (int64_t)st->val.element_size());
        io += (int64_t)st->icounts[r];
        vo += (int64_t)st->vcounts[r];
      }
      return uvccl_allgatherv(&pg_, w, st->idx.data_ptr(),
                              (size_t)st->idx.numel(), st->iptrs.data(),
                              st->icounts.data(), UVCCL_INT64, on_done);
    });
    work->steps.push_back([this, st, vdt](uvccl_work_t* w) {
      return uvccl_allgatherv(&pg_, w, st->val.data_ptr(),
                              (size_t)st->val.numel(), st->vptrs.data(),
                              st->vcounts.data(), vdt, on_done);
    });
    work->after = [st, out, n]() mutable {
      std::vector<at::Tensor> idxs, vals;
      int64_t sd = st->in.sparse_dim();
      auto vshape = st->val.sizes().vec();
      int64_t io = 0, vo = 0;
      for (int r = 0; r < n; r++) {
        int64_t nnz = st->nnz[r];
        idxs.push_back(st->all_idx.narrow(0, io, (int64_t)st->icounts[r])
                           .view({sd, nnz}));
        vshape[0] = nnz;
        vals.push_back(st->all_val.narrow(0, vo, (int64_t)st->vcounts[r])
                           .view(vshape));
        io += (int64_t)st->icounts[r];
        vo += (int64_t)st->vcounts[r];
      }
      auto sum = at::sparse_coo_tensor(at::cat(idxs, 1), at::cat(vals, 0),
                                       st->in.sizes(), st->val.options()
                                           .layout(at::kSparse))
                     .coalesce();
      out.copy_(sum);
    };
    return submit(work, nullptr, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> gather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::GatherOptions& opts) override {
    auto& in = single(inputs, "gather");
    int root = (int)opts.rootRank;
    bool me = getRank() == root;
    TORCH_CHECK(me ? outputs.size() == 1 && (int)outputs[0].size() == getSize()
                   : outputs.empty() || outputs[0].empty(),
                "uvccl: gather: the root gives one list of ", getSize(),
                " outputs, the others none");
    auto src = in.contiguous();
    at::Tensor flat = me ? at::empty({(int64_t)getSize() * in.numel()},
                                     in.options())
                         : at::Tensor();
    std::vector<at::Tensor> outs = me ? outputs[0] : std::vector<at::Tensor>();
    auto work = make_work(c10d::OpType::GATHER, {in}, outs, {src});
    if (me) {
      work->keep.push_back(flat);
      work->after = [outs, flat, n = in.numel()]() mutable {
        for (size_t i = 0; i < outs.size(); i++)
          outs[i].copy_(flat.narrow(0, (int64_t)i * n, n).view(outs[i].sizes()));
      };
    }
    uvccl_dtype_t dt = dtype_of(in);
    return submit(work, [this, src, flat, dt, root](uvccl_work_t* w) {
      return uvccl_gather(&pg_, w, src.data_ptr(),
                          flat.defined() ? flat.data_ptr() : nullptr,
                          (size_t)src.numel(), dt, root, on_done);
    }, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ScatterOptions& opts) override {
    auto& out = single(outputs, "scatter");
    int root = (int)opts.rootRank;
    bool me = getRank() == root;
    TORCH_CHECK(me ? inputs.size() == 1 && (int)inputs[0].size() == getSize()
                   : inputs.empty() || inputs[0].empty(),
                "uvccl: scatter: the root gives one list of ", getSize(),
                " inputs, the others none");
    at::Tensor flat;
    if (me) {
      std::vector<at::Tensor> parts;
      for (auto& t : inputs[0]) parts.push_back(t.reshape(-1));
      flat = at::cat(parts);
    }
    auto dst = out.contiguous();
    auto work = make_work(c10d::OpType::SCATTER, inputs.empty() ? std::vector<at::Tensor>() : inputs[0], {out}, {dst}, out, dst);
    if (me) work->keep.push_back(flat);
    uvccl_dtype_t dt = dtype_of(out);
    return submit(work, [this, flat, dst, dt, root](uvccl_work_t* w) {
      return uvccl_scatter(&pg_, w, flat.defined() ? flat.data_ptr() : nullptr,
                           dst.data_ptr(), (size_t)dst.numel(), dt, root,
                           on_done);
    }, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    auto& out = single(outputs, "reduce_scatter");
    TORCH_CHECK(inputs.size() == 1 && (int)inputs[0].size() == getSize(),
                "uvccl: reduce_scatter wants one list of ", getSize(),
                " inputs");
    std::vector<at::Tensor> parts;
    for (auto& t : inputs[0]) {
      TORCH_CHECK(t.numel() == out.numel(),
                  "uvccl: reduce_scatter: every input must match the output");
      parts.push_back(t.reshape(-1));
    }
    auto flat = at::cat(parts);
    auto dst = out.contiguous();
    auto work = make_work(c10d::OpType::REDUCE_SCATTER, inputs[0], {out}, {flat, dst}, out,
                          dst);
    uvccl_dtype_t dt = dtype_of(out);
    Redop op = redop_of(opts.reduceOp);
    return submit(work, [this, flat, dst, dt, op](uvccl_work_t* w) {
      return uvccl_reduce_scatter(&pg_, w, flat.data_ptr(), dst.data_ptr(),
                                  (size_t)dst.numel(), dt, redop(op), on_done);
    }, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts) override {
    check_cpu(input, "_reduce_scatter_base");
    check_cpu(output, "_reduce_scatter_base");
    TORCH_CHECK(input.numel() == output.numel() * getSize(),
                "uvccl: _reduce_scatter_base: the input must hold size x "
                "output");
    auto src = input.contiguous();
    auto dst = output.contiguous();
    auto work = make_work(c10d::OpType::_REDUCE_SCATTER_BASE, {input}, {output},
                          {src, dst}, output, dst);
    uvccl_dtype_t dt = dtype_of(output);
    Redop op = redop_of(opts.reduceOp);
    return submit(work, [this, src, dst, dt, op](uvccl_work_t* w) {
      return uvccl_reduce_scatter(&pg_, w, src.data_ptr(), dst.data_ptr(),
                                  (size_t)dst.numel(), dt, redop(op), on_done);
    }, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(
      at::Tensor& output, at::Tensor& input,
      std::vector<int64_t>& outSplits, std::vector<int64_t>& inSplits,
      const c10d::AllToAllOptions& opts) override {
    check_cpu(input, "alltoall_base");
    check_cpu(output, "alltoall_base");
    auto src = input.contiguous();
    auto dst = output.contiguous();
    // split sizes are along dim 0: elements per row times rows
    auto counts = [this](const at::Tensor& t, const std::vector<int64_t>& sp) {
      std::vector<size_t> c((size_t)getSize());
      int64_t row = t.dim() > 0 && t.size(0) > 0 ? t.numel() / t.size(0) : 0;
      if (sp.empty()) {
        TORCH_CHECK(t.dim() > 0 && t.size(0) % getSize() == 0,
                    "uvccl: alltoall_base: dim 0 must divide by the size");
        for (auto& x : c) x = (size_t)(t.numel() / getSize());
      } else {
        TORCH_CHECK((int)sp.size() == getSize(),
                    "uvccl: alltoall_base: one split per rank");
        for (size_t i = 0; i < c.size(); i++) c[i] = (size_t)(sp[i] * row);
      }
      return c;
    };
    auto sc = std::make_shared<std::vector<size_t>>(counts(src, inSplits));
    auto rc = std::make_shared<std::vector<size_t>>(counts(dst, outSplits));
    auto work = make_work(c10d::OpType::ALLTOALL_BASE, {input}, {output}, {src, dst},
                          output, dst);
    uvccl_dtype_t dt = dtype_of(input);
    return submit(work, [this, src, dst, sc, rc, dt](uvccl_work_t* w) {
      return uvccl_alltoallv(&pg_, w, src.data_ptr(), sc->data(),
                             dst.data_ptr(), rc->data(), dt, on_done);
    }, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> alltoall(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllToAllOptions& opts) override {
    TORCH_CHECK((int)outputs.size() == getSize() &&
                    (int)inputs.size() == getSize(),
                "uvccl: alltoall wants ", getSize(), " inputs and outputs");
    std::vector<at::Tensor> ins, outs_flat;
    auto sc = std::make_shared<std::vector<size_t>>();
    auto rc = std::make_shared<std::vector<size_t>>();
    int64_t rtot = 0;
    for (int i = 0; i < getSize(); i++) {
      check_cpu(inputs[i], "alltoall");
      ins.push_back(inputs[i].reshape(-1));
      sc->push_back((size_t)inputs[i].numel());
      rc->push_back((size_t)outputs[i].numel());
      rtot += outputs[i].numel();
    }
    auto src = at::cat(ins);
    auto dst = at::empty({rtot}, outputs[0].options());
    auto outs = outputs;
    auto work = make_work(c10d::OpType::ALLTOALL, inputs, outs, {src, dst});
    work->after = [outs, dst]() mutable {
      int64_t off = 0;
      for (auto& o : outs) {
        o.copy_(dst.narrow(0, off, o.numel()).view(o.sizes()));
        off += o.numel();
      }
    };
    uvccl_dtype_t dt = dtype_of(inputs[0]);
    return submit(work, [this, src, dst, sc, rc, dt](uvccl_work_t* w) {
      return uvccl_alltoallv(&pg_, w, src.data_ptr(), sc->data(),
                             dst.data_ptr(), rc->data(), dt, on_done);
    }, opts.timeout);
  }

  // c10d's monitored_barrier, with c10d's messages (scripts and PyTorch's
  // tests match them): every rank tells rank 0 it arrived and waits for
  // rank 0's answer; rank 0 waits for each within the timeout and names
  // the first that did not come (all of them with waitAllRanks), uvccl's
  // own account of the failure following. The messages travel on a
  // private subgroup (mb_pg_), so they never meet the application's own
  // sends and receives, whatever their tags.
  void monitoredBarrier(const c10d::BarrierOptions& opts,
                        bool waitAllRanks) override {
    auto timeout = opts.timeout == c10d::kUnsetTimeout
                       ? std::chrono::milliseconds(timeout_ms_)
                       : opts.timeout;
    int tag = 2 * (int)(mb_count_++ % (1u << 29));
    auto start = std::chrono::steady_clock::now();
    auto p2p = [this](bool is_send, int peer, int tag,
                      std::chrono::milliseconds t) {
      auto work = make_work(is_send ? c10d::OpType::SEND : c10d::OpType::RECV,
                            {}, {}, {});
      uint64_t ms = (uint64_t)std::max<int64_t>(t.count(), 1);
      submit(work, [this, is_send, peer, tag](uvccl_work_t* w) {
        return is_send ? uvccl_send(&mb_pg_, w, nullptr, 0, peer, tag, on_done)
                       : uvccl_recv(&mb_pg_, w, nullptr, 0, peer, tag, on_done);
      }, std::chrono::milliseconds(ms));
      return work;
    };
    auto why = [](const std::exception& e) {
      return std::string("\n Original exception: \n") + e.what();
    };
    int me = getRank(), n = getSize();
    if (me != 0) {
      try {
        p2p(true, 0, tag, timeout)->wait();
        p2p(false, 0, tag + 1, timeout)->wait();
      } catch (const std::exception& e) {
        TORCH_CHECK(false, "Rank ", me, " successfully reached monitoredBarrier,"
                    " but received errors while waiting for send/recv from "
                    "rank 0. Please check rank 0 logs for faulty rank.",
                    why(e));
      }
      return;
    }
    TORCH_CHECK(timeout.count() > 0 || n == 1, "Rank 0 timed out in "
                "monitoredBarrier after ", timeout.count(), " ms.");
    std::vector<c10::intrusive_ptr<WorkUVCCL>> recvs;
    for (int r = 1; r < n; r++) recvs.push_back(p2p(false, r, tag, timeout));
    std::vector<int> failed;
    std::string first_why;
    for (int r = 1; r < n; r++) {
      try {
        recvs[r - 1]->wait();
      } catch (const std::exception& e) {
        failed.push_back(r);
        if (first_why.empty()) first_why = why(e);
      }
    }
    if (!failed.empty()) {
      if (!waitAllRanks)
        TORCH_CHECK(false, "Rank ", failed[0], " failed to pass "
                    "monitoredBarrier in ", timeout.count(), " ms", first_why);
      std::string list;
      for (int r : failed) list += (list.empty() ? "" : ", ") + std::to_string(r);
      TORCH_CHECK(false, "Ranks ", list, " failed to pass monitoredBarrier in ",
                  timeout.count(), " ms", first_why);
    }
    auto left = timeout - std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::steady_clock::now() - start);
    std::vector<c10::intrusive_ptr<WorkUVCCL>> sends;
    for (int r = 1; r < n; r++)
      sends.push_back(p2p(true, r, tag + 1, std::max(left, timeout / 10)));
    for (auto& w : sends) w->wait();
  }

 private:
  // On the loop: uvccl's op id; a PREMUL_SUM factor becomes an id of this
  // group once, then is found again (DDP's 1/world_size on every bucket).
  uvccl_redop_t redop(const Redop& r) {
    if (!r.premul) return r.op;
    auto it = premul_.find(r.factor);
    if (it != premul_.end()) return it->second;
    uvccl_redop_t id;
    int rc = uvccl_pg_premul_sum(&pg_, r.factor, &id);
    TORCH_CHECK(rc == 0, "uvccl: PREMUL_SUM: ", uvccl_strerror(rc));
    premul_.emplace(r.factor, id);
    return id;
  }

  static std::string publish_host() {
    const char* m = getenv("MASTER_ADDR");
    if (m != nullptr && *m != '\0') return m;
    char h[256];
    if (gethostname(h, sizeof(h)) == 0) {
      h[sizeof(h) - 1] = '\0';
      return h;
    }
    return "127.0.0.1";
  }

  // outputs: what result() and the future give; keep: the buffers the
  // operation uses; (user, buf): copy buf back into user after success
  // when they differ (a non-contiguous output).
  c10::intrusive_ptr<WorkUVCCL> make_work(
      c10d::OpType type, const std::vector<at::Tensor>& inputs,
      std::vector<at::Tensor> outputs, std::vector<at::Tensor> keep,
      at::Tensor user = at::Tensor(), at::Tensor buf = at::Tensor()) {
    // the profiler's event: "<backend>:<op>" with the inputs' shapes
    // (complex tensors as their real views, as Gloo records them)
    std::string title = name_ + ":" + op_title(type);
    std::vector<at::Tensor> shown;
    for (auto& t : inputs)
      shown.push_back(t.is_complex() ? at::view_as_real(t) : t);
    auto work = c10::make_intrusive<WorkUVCCL>(type, title.c_str(), shown,
                                               std::move(outputs));
    work->keep = std::move(keep);
    if (user.defined() && buf.defined() && !user.is_same(buf))
      work->after = [user, buf]() mutable { user.copy_(buf); };
    return work;
  }

  static const char* op_title(c10d::OpType type) {
    switch (type) {
      case c10d::OpType::BROADCAST: return "broadcast";
      case c10d::OpType::ALLREDUCE: return "all_reduce";
      case c10d::OpType::ALLREDUCE_COALESCED: return "all_reduce";
      case c10d::OpType::REDUCE: return "reduce";
      case c10d::OpType::ALLGATHER: return "all_gather";
      case c10d::OpType::_ALLGATHER_BASE: return "all_gather_into_tensor";
      case c10d::OpType::ALLGATHER_COALESCED: return "all_gather";
      case c10d::OpType::GATHER: return "gather";
      case c10d::OpType::SCATTER: return "scatter";
      case c10d::OpType::REDUCE_SCATTER: return "reduce_scatter";
      case c10d::OpType::_REDUCE_SCATTER_BASE: return "reduce_scatter_tensor";
      case c10d::OpType::ALLTOALL_BASE: return "all_to_all";
      case c10d::OpType::ALLTOALL: return "all_to_all";
      case c10d::OpType::SEND: return "send";
      case c10d::OpType::RECV: return "recv";
      case c10d::OpType::RECVANYSOURCE: return "recvAnySource";
      case c10d::OpType::BARRIER: return "barrier";
      default: return "unknown";
    }
  }

  // Queues the operation's steps (first, then any already on the work)
  // for the loop. timeout: the options' (unset: the group's).
  c10::intrusive_ptr<c10d::Work> submit(
      const c10::intrusive_ptr<WorkUVCCL>& work, Step first,
      std::chrono::milliseconds timeout = c10d::kUnsetTimeout) {
    WorkUVCCL* raw = work.get();
    auto type = raw->retrieveOpType();
    if (type != c10d::OpType::SEND && type != c10d::OpType::RECV &&
        type != c10d::OpType::RECVANYSOURCE)
      seq_++;
    if (first) raw->steps.push_front(std::move(first));
    if (timeout.count() > 0) raw->timeout_ms = (uint64_t)timeout.count();
    c10::raw::intrusive_ptr::incref(raw);  // the loop's, until on_done
    loop_->post([this, raw]() {
      if (!pg_up_) {
        raw->complete(UVCCL_ECLOSING, "the process group is shut down");
      } else {
        raw->start_next();
      }
      if (raw->isCompleted()) {  // refused at the call: no callback comes
        raw->keep.clear();
        c10::raw::intrusive_ptr::decref(raw);
      }
    });
    return work;
  }

  void shutdown() {
    if (shut_) return;
    shut_ = true;
    std::promise<void> done;
    auto f = done.get_future();
    loop_->post([this, &done]() {
      pg_up_ = false;
      parts_ = 1;  // this task's own
      if (mb_pg_.impl_ != nullptr) {  // a handle on pg_'s connections
        parts_++;
        mb_pg_.data = this;
        uvccl_pg_destroy(&mb_pg_, [](uvccl_pg_t* p) {
          static_cast<ProcessGroupUVCCL*>(p->data)->part_done();
        });
      }
      if (pg_.impl_ != nullptr) {
        parts_++;
        pg_.data = this;
        uvccl_pg_destroy(&pg_, [](uvccl_pg_t* p) {
          static_cast<ProcessGroupUVCCL*>(p->data)->part_done();
        });
      }
      part_done_ = &done;
      part_done();
    });
    // Destroyed from Python (the last reference dropped, or at exit) this
    // thread holds the GIL; the loop thread may need it meanwhile (a
    // future's Python callback, as DDP's hooks): wait without it.
    if (Py_IsInitialized() && PyGILState_Check()) {
      py::gil_scoped_release nogil;
      f.wait();
    } else {
      f.wait();
    }
  }

  // destroy order: the group, then its store client, then the server
  void part_done() {
    if (--parts_ > 0) return;
    if (has_store_) {
      has_store_ = false;
      parts_ = 1;
      store_.data = this;
      uvccl_store_close(&store_, [](uvccl_store_t* s) {
        static_cast<ProcessGroupUVCCL*>(s->data)->part_done();
      });
      return;
    }
    if (has_server_) {
      has_server_ = false;
      parts_ = 1;
      server_.data = this;
      uvccl_store_server_close(&server_, [](uvccl_store_server_t* s) {
        static_cast<ProcessGroupUVCCL*>(s->data)->part_done();
      });
      return;
    }
    part_done_->set_value();
  }

  std::shared_ptr<Loop> loop_;
  std::string name_;
  std::map<double, uvccl_redop_t> premul_;
  std::atomic<uint64_t> seq_{0};
  uvccl_pg_t pg_;
  uvccl_pg_t mb_pg_;                 // monitoredBarrier's messages
  uint32_t mb_count_ = 0;
  uvccl_store_t store_;
  uvccl_store_server_t server_;
  uvccl_work_t init_w_;
  std::string host_;
  uint64_t timeout_ms_ = 0;
  bool has_server_ = false, has_store_ = false, pg_up_ = false, shut_ = false;
  int parts_ = 0;
  std::promise<void>* part_done_ = nullptr;
  std::mutex init_mu_;
  std::condition_variable init_cv_;
  bool init_done_ = false;
  int init_status_ = 0;
  std::string init_msg_;
};

}  // namespace uvccl_torch

PYBIND11_MODULE(_C, m) {
  m.doc() = "uvccl's c10d backend (see python/uvccl_torch/__init__.py)";
  py::class_<uvccl_torch::ProcessGroupUVCCL, uvccl_torch::PGBase,
             c10::intrusive_ptr<uvccl_torch::ProcessGroupUVCCL>>(
      m, "ProcessGroupUVCCL")
      .def(py::init<const c10::intrusive_ptr<c10d::Store>&, int, int,
                    std::chrono::milliseconds, std::string>(),
           py::arg("store"), py::arg("rank"), py::arg("size"),
           py::arg("timeout"), py::arg("name") = "uvccl",
           py::call_guard<py::gil_scoped_release>())
      .def("abort", &uvccl_torch::ProcessGroupUVCCL::abort,
           py::arg("reason") = "aborted by its application",
           py::call_guard<py::gil_scoped_release>(),
           "Fails every pending operation of the group, here and on every "
           "other rank (with the reason); destroy the group after.");
}
