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
//
// CUDA tensors (built against a PyTorch with CUDA: UVCCL_TORCH_CUDA):
// through a uvccl NCCL group beside the TCP one where every rank has a GPU
// of its own, else staged over the TCP group (see "CUDA tensors" in the
// process group).
#include <torch/python.h>
#include <torch/version.h>
#if TORCH_VERSION_MAJOR >= 2
// PyTorch 2: a process group holds one Backend per device type; this one
// serves CPU tensors, and CUDA tensors where built for them.
#include <torch/csrc/distributed/c10d/Backend.hpp>
#define UVCCL_TORCH2 1
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <pybind11/chrono.h>
#ifdef UVCCL_TORCH_CUDA
// CUDA tensors: the caller's current stream orders the operations (see
// ProcessGroupUVCCL::target)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <uvccl.h>

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
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

// CPU tensors, and CUDA tensors where the extension was built against a
// PyTorch with CUDA; dense only (sparse tensors: allreduce SUM alone).
static void check_tensor(const at::Tensor& t, const char* op) {
#ifdef UVCCL_TORCH_CUDA
  TORCH_CHECK(t.device().is_cpu() || t.device().is_cuda(), "uvccl: ", op,
              ": CPU or CUDA tensors only (got ", t.device(), ")");
#else
  TORCH_CHECK(t.device().is_cpu(), "uvccl: ", op,
              ": CPU tensors only in this build (got ", t.device(),
              "; CUDA tensors need the extension built against a PyTorch "
              "with CUDA)");
#endif
  TORCH_CHECK(!t.is_sparse(), "uvccl: ", op, ": sparse tensors are only "
              "supported by allreduce (SUM)");
}

static at::Tensor& single(std::vector<at::Tensor>& ts, const char* op) {
  TORCH_CHECK(ts.size() == 1, "uvccl: ", op, " takes one tensor per call, ",
              "got ", ts.size());
  check_tensor(ts[0], op);
  return ts[0];
}

// A tensor's bytes, as a flat uint8 tensor on its device (a copy where not
// contiguous).
static at::Tensor bytes_of(const at::Tensor& t) {
  auto c = t.contiguous();
  return at::from_blob(c.data_ptr(), {(int64_t)c.nbytes()},
                       [c](void*) {}, c.options().dtype(at::kByte));
}

// 64-bit FNV-1a: the same on every process (std::hash need not be).
static uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return h;
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
#ifdef UVCCL_TORCH_CUDA
static void on_dep(uvccl_work_t* w, int status);
static void on_ordered(uvccl_work_t* w, int status);
#endif

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
  // host arrays a uvccl call was handed (counts, p2p ops) that it reads
  // or fills until it completes: the steps that made the call do not
  // outlive their start
  std::vector<std::shared_ptr<void>> hold;
  std::function<void()> after;       // copies back (non-contiguous outputs)
  std::deque<Step> steps;            // run one after another, on the loop
  uint64_t timeout_ms = 0;           // per-operation; 0: the group's
  int source_ = -1;   // recv from any source: the sender, once done
  // CUDA tensors: their device (-1: host tensors); nccl: the operation
  // runs on the group's NCCL group, after the work queued on stream (the
  // caller's current stream when it was called)
  int cuda_dev = -1;
  bool nccl = false;
  void* stream = nullptr;
  // NCCL, nothing to copy back: the caller's stream is made to wait for
  // the operation, and wait() returns once that is in place, as NCCL's
  // own backend does (the host does not wait for the GPU)
  bool stream_wait = false;

#ifdef UVCCL_TORCH_CUDA
  bool wait(std::chrono::milliseconds timeout =
                std::chrono::milliseconds(0)) override {  // 0: no limit
    if (!stream_wait) return c10d::Work::wait(timeout);
    int how;
    {
      std::unique_lock<std::mutex> g(omu_);
      auto pred = [this] { return ordered_ != 0 || isCompleted(); };
      if (timeout.count() == 0)
        ocv_.wait(g, pred);
      else
        TORCH_CHECK(ocv_.wait_for(g, timeout, pred),
                    "uvccl: wait() timed out after ", timeout.count(), " ms");
      how = ordered_;
    }
    // failed, done, or ordered on a stream other than the current one:
    // as for host tensors
    if (how != 1 || isCompleted() ||
        (void*)c10::cuda::getCurrentCUDAStream((c10::DeviceIndex)cuda_dev)
                .stream() != stream)
      return c10d::Work::wait(timeout);
    return true;
  }

  // On the loop: the caller's stream waits for the operation (1), or
  // could not be made to (-1: wait() waits for the work instead).
  void set_ordered(int how) {
    {
      std::lock_guard<std::mutex> g(omu_);
      ordered_ = how;
    }
    ocv_.notify_all();
  }
#endif

  // A uvccl work of this operation's that is not a step (it completes on
  // its own): lives as long as this object.
  uvccl_work_t* side_work() {
    ws_.emplace_back(new uvccl_work_t);
    uvccl_work_t* w = ws_.back().get();
    std::memset(w, 0, sizeof(*w));
    w->data = this;
    return w;
  }

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

  // On the loop thread: the operation ended. Once: a later account (the
  // stream dependency failing after the operation did) is dropped.
  void complete(int status, const char* msg) {
    if (isCompleted()) return;
    if (status == 0) {
      try {
        if (after) run_after();
      } catch (...) {
        complete_exc(std::current_exception());
        return;
      }
      finish();
      future_->markCompleted(c10::IValue(outputs_));
      wake();
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

  // (the buffers stay: a failure can be told before uvccl is done with
  // them, as when the stream dependency fails; release() lets them go)
  void complete_exc(std::exception_ptr e) {
    if (isCompleted()) return;
    finish(e);
    future_->setError(e);
    wake();
    steps.clear();
    after = nullptr;
  }

  // uvccl is done with this operation's memory.
  void release() {
    keep.clear();
    hold.clear();
  }

  // The copies back into the caller's tensors. CUDA tensors: on the
  // device's current stream of this (the loop's) thread, waited for, so
  // the results are in place when wait() returns.
  void run_after() {
#ifdef UVCCL_TORCH_CUDA
    if (cuda_dev >= 0) {
      c10::cuda::CUDAGuard guard((c10::DeviceIndex)cuda_dev);
      after();
      c10::cuda::getCurrentCUDAStream((c10::DeviceIndex)cuda_dev).synchronize();
      return;
    }
#endif
    after();
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
  void wake() {
    { std::lock_guard<std::mutex> g(omu_); }
    ocv_.notify_all();
  }

  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<at::ivalue::Future> future_;
  std::vector<std::unique_ptr<uvccl_work_t>> ws_;
  std::mutex omu_;
  std::condition_variable ocv_;
  int ordered_ = 0;
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
  work->release();
  c10::raw::intrusive_ptr::decref(work);  // the loop's reference
}

#ifdef UVCCL_TORCH_CUDA
// The NCCL stream's dependency on the caller's stream is in place (or
// failed: then the operation fails, unless it already ended).
static void on_dep(uvccl_work_t* w, int status) {
  auto* work = static_cast<WorkUVCCL*>(w->data);
  if (status != 0) work->complete(status, w->msg);
  c10::raw::intrusive_ptr::decref(work);  // on_dep's reference
}

// The caller's stream now waits for the operation (wait() may return).
static void on_ordered(uvccl_work_t* w, int status) {
  auto* work = static_cast<WorkUVCCL*>(w->data);
  work->set_ordered(status == 0 ? 1 : -1);
  c10::raw::intrusive_ptr::decref(work);  // on_ordered's reference
}
#endif

// The operations of a coalescing block (c10d's _coalescing_manager, which
// batch_isend_irecv uses on CUDA tensors) as one Work: done when all are.
#ifdef UVCCL_TORCH2
class MultiWork : public c10d::Work {
 public:
  explicit MultiWork(std::vector<c10::intrusive_ptr<WorkUVCCL>> works)
      : c10d::Work(-1, c10d::OpType::COALESCED),
        works_(std::move(works)),
        future_(c10::make_intrusive<at::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()))) {}

  // After construction (the callbacks hold a reference, dropped once the
  // operations' futures have run them: every operation ends, at the
  // latest at its timeout).
  static c10::intrusive_ptr<MultiWork> make(
      std::vector<c10::intrusive_ptr<WorkUVCCL>> works) {
    auto mw = c10::make_intrusive<MultiWork>(std::move(works));
    if (mw->works_.empty()) {
      mw->done(nullptr);
      return mw;
    }
    auto left = std::make_shared<std::atomic<size_t>>(mw->works_.size());
    auto err = std::make_shared<std::exception_ptr>();
    auto mu = std::make_shared<std::mutex>();
    for (auto& w : mw->works_) {
      w->getFuture()->addCallback(
          [mw, left, err, mu](at::ivalue::Future& f) {
            if (f.hasError()) {
              std::lock_guard<std::mutex> g(*mu);
              if (!*err) *err = f.exception_ptr();
            }
            if (--*left == 0) mw->done(*err);
          });
    }
    return mw;
  }

  void done(std::exception_ptr e) {
    finish(e);
    if (e)
      future_->setError(e);
    else
      future_->markCompleted(c10::IValue(std::vector<at::Tensor>()));
  }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    return future_;
  }

 private:
  std::vector<c10::intrusive_ptr<WorkUVCCL>> works_;
  c10::intrusive_ptr<at::ivalue::Future> future_;
};
#endif

// ---- the process group -------------------------------------------------------

class ProcessGroupUVCCL : public PGBase {
  // how CUDA tensors travel (see "CUDA tensors" below)
  enum CudaMode { kCudaNone, kCudaStaged, kCudaNccl };

  // where an operation runs
  struct Target {
    uvccl_pg_t* pg;
    int dev = -1;        // CUDA tensors' device
    bool nccl = false;   // through npg_
  };

 public:
  // cuda_device: this rank's CUDA device (PyTorch's current one), -1
  // without CUDA; cuda_id: which GPU that is, the same string on two ranks
  // only where they share it (host, boot and device UUID); nccl_ok: NCCL
  // is there (see "CUDA tensors" below).
  ProcessGroupUVCCL(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                    int size, std::chrono::milliseconds timeout,
                    std::string name = "uvccl", int cuda_device = -1,
                    std::string cuda_id = "", bool nccl_ok = false)
      : PGBase(rank, size),
        loop_(Loop::get()),
        name_(std::move(name)) {
    std::memset(&pg_, 0, sizeof(pg_));
    std::memset(&mb_pg_, 0, sizeof(mb_pg_));
    std::memset(&npg_, 0, sizeof(npg_));
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
      return std::string();
    });
    if (!msg.empty()) {
      shutdown();
      TORCH_CHECK(false, "uvccl: ", msg);
    }
    int rc = blocking([this, rank, size](uvccl_work_t* w, uvccl_work_cb cb) {
      uvccl_pg_options_t o;
      std::memset(&o, 0, sizeof(o));
      o.rank = rank;
      o.size = size;
      o.timeout_ms = timeout_ms_;
      return uvccl_pg_init(loop_->loop(), &pg_, &store_, &o, w, cb);
    }, &msg);
    if (rc != 0) {
      shutdown();
      TORCH_CHECK(false, "uvccl: creating the group: ", msg);
    }
    // the private subgroup of monitoredBarrier: every rank makes it now,
    // in the same place, as uvccl_pg_new_group asks
    std::vector<int> all(size);
    for (int i = 0; i < size; i++) all[i] = i;
    rc = loop_->call<int>([this, &all, size]() {
      return uvccl_pg_new_group(&pg_, &mb_pg_, all.data(), size, nullptr);
    });
    if (rc != 0) {
      shutdown();
      TORCH_CHECK(false, "uvccl: creating the group: ", uvccl_strerror(rc));
    }
    pg_up_ = true;
    try {
      setup_cuda(cuda_device, cuda_id, nccl_ok);
    } catch (...) {
      shutdown();
      throw;
    }
  }

  // "nccl", "staged" or "none": how CUDA tensors travel in this group.
  std::string cuda_mode() const {
    return cuda_mode_ == kCudaNccl ? "nccl"
           : cuda_mode_ == kCudaStaged ? "staged" : "none";
  }

  ~ProcessGroupUVCCL() override { shutdown(); }

  const std::string getBackendName() const override { return name_; }

  // Fails every pending operation of the group at once, here and (with
  // the reason) on every other rank; the group is unusable after (destroy
  // it). For an application that must stop a stuck job without waiting
  // for its timeouts.
  // c10d's own abort (a virtual of Backend in newer PyTorch, which
  // _abort_process_group calls; declared without `override` so that it
  // overrides where the base has it and is a plain method where not).
  void abort() { abort("aborted by its application"); }

  void abort(const std::string& reason) {
    loop_->call<int>([this, reason]() {
      if (pg_up_) uvccl_pg_abort(&pg_, reason.c_str());
      if (pg_up_ && npg_.impl_ != nullptr)
        uvccl_pg_abort(&npg_, reason.c_str());
      return 0;
    });
  }

  // c10d's per-group sequence number: every collective counts one (point-
  // to-point operations do not: they need not match across ranks). Groups
  // are made by all their ranks at once, so every rank starts at 0.
  void setSequenceNumberForGroup() override { seq_ = 0; }
  uint64_t getSequenceNumberForGroup() override { return seq_.load(); }

  // Runs one uvccl operation started by start (on the loop) and waits for
  // it; 0 or the code, with its message in *msg.
  int blocking(std::function<int(uvccl_work_t*, uvccl_work_cb)> start,
               std::string* msg) {
    struct Wait {
      uvccl_work_t w;
      std::promise<int> done;
      std::string msg;
    };
    auto wt = std::make_shared<Wait>();
    std::memset(&wt->w, 0, sizeof(wt->w));
    auto f = wt->done.get_future();
    loop_->post([wt, start]() {
      wt->w.data = new std::shared_ptr<Wait>(wt);
      int rc = start(&wt->w, [](uvccl_work_t* w, int status) {
        auto* ref = static_cast<std::shared_ptr<Wait>*>(w->data);
        (*ref)->msg = w->msg;
        (*ref)->done.set_value(status);
        delete ref;
      });
      if (rc != 0) {
        delete static_cast<std::shared_ptr<Wait>*>(wt->w.data);
        wt->msg = wt->w.msg[0] ? wt->w.msg : uvccl_strerror(rc);
        wt->done.set_value(rc);
      }
    });
    int rc = f.get();
    if (msg) *msg = wt->msg;
    return rc;
  }

  // At creation, on every rank alike: how CUDA tensors will travel. The
  // ranks exchange (GPU identity, device, NCCL there) over the TCP group
  // and all reach the same answer from the same facts; where it is NCCL,
  // the NCCL group is made now, by every rank at once (made at a first
  // CUDA operation instead, a point-to-point one would wait for ranks
  // that never join). $UVCCL_TORCH_CUDA: auto (default), nccl (fail
  // where it cannot be), staged.
  void setup_cuda(int dev, const std::string& id, bool nccl_ok) {
    const char* env = getenv("UVCCL_TORCH_CUDA");
    std::string want = env && *env ? env : "auto";
    TORCH_CHECK(want == "auto" || want == "nccl" || want == "staged",
                "uvccl: UVCCL_TORCH_CUDA must be auto, nccl or staged (got '",
                want, "')");
#ifndef UVCCL_TORCH_CUDA
    dev = -1;
#endif
    struct Rec {
      uint64_t id;
      int64_t dev;
      int64_t nccl;
    };
    int n = getSize();
    std::vector<Rec> recs((size_t)n);
    Rec mine{dev >= 0 ? fnv1a(id) : 0, dev, nccl_ok ? 1 : 0};
    std::string msg;
    int rc = blocking([this, &mine, &recs](uvccl_work_t* w, uvccl_work_cb cb) {
      return uvccl_allgather(&pg_, w, &mine, recs.data(), 3, UVCCL_INT64, cb);
    }, &msg);
    TORCH_CHECK(rc == 0, "uvccl: creating the group (GPU exchange): ", msg);
    cuda_dev_ = dev;
    if (dev < 0) return;  // no CUDA tensors here
    std::string why;      // why not NCCL
    for (int r = 0; r < n && why.empty(); r++) {
      if (recs[r].dev < 0)
        why = "rank " + std::to_string(r) + " has no CUDA device";
      else if (!recs[r].nccl)
        why = "rank " + std::to_string(r) + " has no NCCL";
      for (int q = 0; q < r && why.empty(); q++)
        if (recs[q].id == recs[r].id)
          why = "ranks " + std::to_string(q) + " and " + std::to_string(r) +
                " share a GPU";
    }
    if (want == "staged" || (want == "auto" && !why.empty())) {
      cuda_mode_ = kCudaStaged;
      return;
    }
    TORCH_CHECK(why.empty(), "uvccl: UVCCL_TORCH_CUDA=nccl, but ", why);
    int r = getRank(), sz = n;
    rc = blocking([this, r, sz, dev](uvccl_work_t* w, uvccl_work_cb cb) {
      uvccl_pg_options_t o;
      std::memset(&o, 0, sizeof(o));
      o.rank = r;
      o.size = sz;
      o.timeout_ms = timeout_ms_;
      o.prefix = "uvccl/cuda";
      o.backend = UVCCL_BACKEND_NCCL;
      o.device = dev;
      return uvccl_pg_init(loop_->loop(), &npg_, &store_, &o, w, cb);
    }, &msg);
    TORCH_CHECK(rc == 0, "uvccl: creating the NCCL group for CUDA tensors: ",
                msg);
    cuda_mode_ = kCudaNccl;
  }

  // ---- collectives ----

  c10::intrusive_ptr<c10d::Work> broadcast(
      std::vector<at::Tensor>& tensors,
      const c10d::BroadcastOptions& opts) override {
    auto& t = single(tensors, "broadcast");
    Target tg = target({t}, "broadcast");
    auto buf = t.contiguous();
    auto work = make_work(c10d::OpType::BROADCAST, {t}, {t}, {buf}, t, buf);
    uvccl_dtype_t dt = dtype_of(t);
    int root = (int)opts.rootRank;
    return submit(work, tg, [g = tg.pg, buf, dt, root](uvccl_work_t* w) {
      return uvccl_broadcast(g, w, buf.data_ptr(), (size_t)buf.numel(), dt,
                             root, on_done);
    }, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts) override {
    if (tensors.size() == 1 && tensors[0].is_sparse())
      return sparse_sum(tensors[0], opts);
    auto& t = single(tensors, "allreduce");
    Redop op = redop_of(opts.reduceOp);
    Target tg = target({t}, "allreduce", nccl_can(op));
    auto buf = t.contiguous();
    auto work = make_work(c10d::OpType::ALLREDUCE, {t}, {t}, {buf}, t, buf);
    uvccl_dtype_t dt = dtype_of(t);
    return submit(work, tg, [this, g = tg.pg, buf, dt, op](uvccl_work_t* w) {
      return uvccl_allreduce(g, w, buf.data_ptr(), buf.data_ptr(),
                             (size_t)buf.numel(), dt, redop(g, op), on_done);
    }, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> reduce(
      std::vector<at::Tensor>& tensors,
      const c10d::ReduceOptions& opts) override {
    auto& t = single(tensors, "reduce");
    Redop op = redop_of(opts.reduceOp);
    Target tg = target({t}, "reduce", nccl_can(op));
    auto buf = t.contiguous();
    auto work = make_work(c10d::OpType::REDUCE, {t}, {t}, {buf}, t, buf);
    uvccl_dtype_t dt = dtype_of(t);
    int root = (int)opts.rootRank;
    return submit(work, tg, [this, g = tg.pg, buf, dt, op, root](uvccl_work_t* w) {
      return uvccl_reduce(g, w, buf.data_ptr(), buf.data_ptr(),
                          (size_t)buf.numel(), dt, redop(g, op), root, on_done);
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
    std::vector<at::Tensor> all = outputs[0];
    all.push_back(in);
    Target tg = target(all, "allgather");
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
    return submit(work, tg, [g = tg.pg, src, flat, dt](uvccl_work_t* w) {
      return uvccl_allgather(g, w, src.data_ptr(), flat.data_ptr(),
                             (size_t)src.numel(), dt, on_done);
    }, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::AllgatherOptions& opts) override {
    check_tensor(input, "_allgather_base");
    check_tensor(output, "_allgather_base");
    TORCH_CHECK(output.numel() == input.numel() * getSize(),
                "uvccl: _allgather_base: the output must hold size x input");
    Target tg = target({input, output}, "_allgather_base");
    auto src = input.contiguous();
    auto dst = output.contiguous();
    auto work = make_work(c10d::OpType::_ALLGATHER_BASE, {input}, {output}, {src, dst},
                          output, dst);
    uvccl_dtype_t dt = dtype_of(input);
    return submit(work, tg, [g = tg.pg, src, dst, dt](uvccl_work_t* w) {
      return uvccl_allgather(g, w, src.data_ptr(), dst.data_ptr(),
                             (size_t)src.numel(), dt, on_done);
    }, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> barrier(
      const c10d::BarrierOptions& opts) override {
    auto work = make_work(c10d::OpType::BARRIER, {}, {}, {});
    return submit(work, Target{&pg_}, [this](uvccl_work_t* w) {
      return uvccl_barrier(&pg_, w, on_done);
    }, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors,
                                      int dst, int tag) override {
    auto& t = single(tensors, "send");
    Target tg = target({t}, "send");
    auto buf = t.contiguous();
    auto work = make_work(c10d::OpType::SEND, {t}, {t}, {buf});
    size_t n = (size_t)buf.nbytes();
    if (coalescing_) return defer_p2p(work, tg, true, buf, dst, tag);
    return submit(work, tg, [g = tg.pg, buf, n, dst, tag](uvccl_work_t* w) {
      return uvccl_send(g, w, buf.data_ptr(), n, dst, tag, on_done);
    });
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors,
                                      int src, int tag) override {
    auto& t = single(tensors, "recv");
    Target tg = target({t}, "recv");
    auto buf = t.contiguous();
    auto work = make_work(c10d::OpType::RECV, {t}, {t}, {buf}, t, buf);
    size_t n = (size_t)buf.nbytes();
    if (coalescing_) return defer_p2p(work, tg, false, buf, src, tag);
    return submit(work, tg, [g = tg.pg, buf, n, src, tag](uvccl_work_t* w) {
      return uvccl_recv(g, w, buf.data_ptr(), n, src, tag, on_done);
    });
  }

  c10::intrusive_ptr<c10d::Work> recvAnysource(
      std::vector<at::Tensor>& tensors, int tag) override {
    auto& t = single(tensors, "recv");
    // from any source: the sender must use the same transport, so
    // CUDA tensors are staged through the TCP group on both sides (a
    // send matching it must be staged too: NCCL groups refuse this)
    TORCH_CHECK(!t.is_cuda() || cuda_mode_ != kCudaNccl,
                "uvccl: recv from any source is not supported for CUDA "
                "tensors on NCCL (name the source rank)");
    Target tg = target({t}, "recv");
    auto buf = t.contiguous();
    auto work = make_work(c10d::OpType::RECVANYSOURCE, {t}, {t}, {buf}, t, buf);
    work->source_ = -2;  // filled in by on_done
    size_t n = (size_t)buf.nbytes();
    return submit(work, tg, [g = tg.pg, buf, n, tag](uvccl_work_t* w) {
      return uvccl_recv(g, w, buf.data_ptr(), n, UVCCL_ANY_SOURCE, tag,
                        on_done);
    });
  }

  // One flat buffer per dtype: one operation each, then the pieces go back.
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts) override {
    TORCH_CHECK(!tensors.empty(), "uvccl: allreduce_coalesced: no tensors");
    for (auto& t : tensors) check_tensor(t, "allreduce_coalesced");
    Redop op = redop_of(opts.reduceOp);
    Target tg = target(tensors, "allreduce_coalesced", nccl_can(op));
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
      work->steps.push_back([this, g = tg.pg, flat, dt, op](uvccl_work_t* w) {
        return uvccl_allreduce(g, w, flat.data_ptr(), flat.data_ptr(),
                               (size_t)flat.numel(), dt, redop(g, op), on_done);
      });
      backs.push_back([same, flat]() mutable { unflatten(flat, same); });
    }
    work->after = [backs]() {
      for (auto& b : backs) b();
    };
    return submit(work, tg, nullptr, opts.timeout);
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
      check_tensor(t, "allgather_coalesced");
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
    std::vector<at::Tensor> outs;
    for (auto& l : output_lists) outs.insert(outs.end(), l.begin(), l.end());
    std::vector<at::Tensor> all = outs;
    all.insert(all.end(), inputs.begin(), inputs.end());
    Target tg = target(all, "allgather_coalesced");
    auto bopts = at::TensorOptions().dtype(at::kByte).device(
        inputs.empty() ? at::Device(at::kCPU) : inputs[0].device());
    auto src = bytes.empty() ? at::empty({0}, bopts) : at::cat(bytes);
    auto flat = at::empty({total * getSize()}, bopts);
    auto work = make_work(c10d::OpType::ALLGATHER_COALESCED, inputs, outs, {src, flat});
    auto lists = output_lists;
    work->after = [lists, flat, total]() mutable {
      for (size_t r = 0; r < lists.size(); r++)
        unflatten_bytes(flat.narrow(0, (int64_t)r * total, total), lists[r]);
    };
    return submit(work, tg, [g = tg.pg, src, flat](uvccl_work_t* w) {
      return uvccl_allgather(g, w, src.data_ptr(), flat.data_ptr(),
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
    TORCH_CHECK(t.device().is_cpu(), "uvccl: sparse allreduce: CPU tensors "
                "only (got ", t.device(), ")");
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
    return submit(work, Target{&pg_}, nullptr, opts.timeout);
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
    std::vector<at::Tensor> all = me ? outputs[0] : std::vector<at::Tensor>();
    all.push_back(in);
    Target tg = target(all, "gather");
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
    return submit(work, tg, [g = tg.pg, src, flat, dt, root](uvccl_work_t* w) {
      return uvccl_gather(g, w, src.data_ptr(),
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
    std::vector<at::Tensor> all = me ? inputs[0] : std::vector<at::Tensor>();
    all.push_back(out);
    Target tg = target(all, "scatter");
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
    return submit(work, tg, [g = tg.pg, flat, dst, dt, root](uvccl_work_t* w) {
      return uvccl_scatter(g, w, flat.defined() ? flat.data_ptr() : nullptr,
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
    Redop op = redop_of(opts.reduceOp);
    std::vector<at::Tensor> all = inputs[0];
    all.push_back(out);
    Target tg = target(all, "reduce_scatter", nccl_can(op));
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
    return submit(work, tg, [this, g = tg.pg, flat, dst, dt, op](uvccl_work_t* w) {
      return uvccl_reduce_scatter(g, w, flat.data_ptr(), dst.data_ptr(),
                                  (size_t)dst.numel(), dt, redop(g, op), on_done);
    }, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts) override {
    check_tensor(input, "_reduce_scatter_base");
    check_tensor(output, "_reduce_scatter_base");
    TORCH_CHECK(input.numel() == output.numel() * getSize(),
                "uvccl: _reduce_scatter_base: the input must hold size x "
                "output");
    Redop op = redop_of(opts.reduceOp);
    Target tg = target({input, output}, "_reduce_scatter_base", nccl_can(op));
    auto src = input.contiguous();
    auto dst = output.contiguous();
    auto work = make_work(c10d::OpType::_REDUCE_SCATTER_BASE, {input}, {output},
                          {src, dst}, output, dst);
    uvccl_dtype_t dt = dtype_of(output);
    return submit(work, tg, [this, g = tg.pg, src, dst, dt, op](uvccl_work_t* w) {
      return uvccl_reduce_scatter(g, w, src.data_ptr(), dst.data_ptr(),
                                  (size_t)dst.numel(), dt, redop(g, op), on_done);
    }, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(
      at::Tensor& output, at::Tensor& input,
      std::vector<int64_t>& outSplits, std::vector<int64_t>& inSplits,
      const c10d::AllToAllOptions& opts) override {
    check_tensor(input, "alltoall_base");
    check_tensor(output, "alltoall_base");
    Target tg = target({input, output}, "alltoall_base");
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
    work->hold = {sc, rc};
    uvccl_dtype_t dt = dtype_of(input);
    return submit(work, tg, [g = tg.pg, src, dst, sc, rc, dt](uvccl_work_t* w) {
      return uvccl_alltoallv(g, w, src.data_ptr(), sc->data(),
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
      check_tensor(inputs[i], "alltoall");
      ins.push_back(inputs[i].reshape(-1));
      sc->push_back((size_t)inputs[i].numel());
      rc->push_back((size_t)outputs[i].numel());
      rtot += outputs[i].numel();
    }
    std::vector<at::Tensor> all = outputs;
    all.insert(all.end(), inputs.begin(), inputs.end());
    Target tg = target(all, "alltoall");
    auto src = at::cat(ins);
    auto dst = at::empty({rtot}, outputs[0].options());
    auto outs = outputs;
    auto work = make_work(c10d::OpType::ALLTOALL, inputs, outs, {src, dst});
    work->hold = {sc, rc};
    work->after = [outs, dst]() mutable {
      int64_t off = 0;
      for (auto& o : outs) {
        o.copy_(dst.narrow(0, off, o.numel()).view(o.sizes()));
        off += o.numel();
      }
    };
    uvccl_dtype_t dt = dtype_of(inputs[0]);
    return submit(work, tg, [g = tg.pg, src, dst, sc, rc, dt](uvccl_work_t* w) {
      return uvccl_alltoallv(g, w, src.data_ptr(), sc->data(),
                             dst.data_ptr(), rc->data(), dt, on_done);
    }, opts.timeout);
  }

#ifdef UVCCL_TORCH2
  // c10d's coalescing blocks (batch_isend_irecv on CUDA tensors, the
  // _coalescing_manager): the sends and receives called inside start
  // together as one uvccl_p2p_batch at the end (on NCCL a send and a
  // receive started one after the other could wait for each other); the
  // collectives run as called. endCoalescing's Work covers them all.
  void startCoalescing() override {
    TORCH_CHECK(!coalescing_, "uvccl: a coalescing block is already open");
    coalescing_ = true;
    coalesced_.clear();
    batch_.clear();
  }

  c10::intrusive_ptr<c10d::Work> endCoalescing() override {
    TORCH_CHECK(coalescing_, "uvccl: endCoalescing without startCoalescing");
    coalescing_ = false;
    auto works = std::move(coalesced_);
    coalesced_.clear();
    if (!batch_.empty()) works.push_back(submit_batch());
    return MultiWork::make(std::move(works));
  }
#endif

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
      submit(work, Target{&mb_pg_}, [this, is_send, peer, tag](uvccl_work_t* w) {
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
  // On the loop: uvccl's op id; a PREMUL_SUM factor becomes an id of the
  // group g once, then is found again (DDP's 1/world_size on every bucket).
  uvccl_redop_t redop(uvccl_pg_t* g, const Redop& r) {
    if (!r.premul) return r.op;
    auto key = std::make_pair(g, r.factor);
    auto it = premul_.find(key);
    if (it != premul_.end()) return it->second;
    uvccl_redop_t id;
    int rc = uvccl_pg_premul_sum(g, r.factor, &id);
    TORCH_CHECK(rc == 0, "uvccl: PREMUL_SUM: ", uvccl_strerror(rc));
    premul_.emplace(key, id);
    return id;
  }

  // A send or receive inside a coalescing block: started with the others
  // at endCoalescing (its own Work completes with the batch).
  struct Deferred {
    c10::intrusive_ptr<WorkUVCCL> work;
    Target tg;
    bool is_send;
    at::Tensor buf;
    int peer, tag;
  };

  c10::intrusive_ptr<c10d::Work> defer_p2p(
      const c10::intrusive_ptr<WorkUVCCL>& work, const Target& tg,
      bool is_send, const at::Tensor& buf, int peer, int tag) {
    if (!batch_.empty())
      TORCH_CHECK(batch_[0].tg.pg == tg.pg && batch_[0].tg.dev == tg.dev,
                  "uvccl: a batch of sends and receives on tensors of two "
                  "devices");
    batch_.push_back(Deferred{work, tg, is_send, buf, peer, tag});
    return work;
  }

  c10::intrusive_ptr<WorkUVCCL> submit_batch() {
    auto items = std::make_shared<std::vector<Deferred>>(std::move(batch_));
    batch_.clear();
    auto ops = std::make_shared<std::vector<uvccl_p2p_op_t>>(items->size());
    std::vector<at::Tensor> ins, keep;
    for (size_t i = 0; i < items->size(); i++) {
      auto& d = (*items)[i];
      auto& o = (*ops)[i];
      std::memset(&o, 0, sizeof(o));
      o.is_send = d.is_send;
      o.buf = d.buf.data_ptr();
      o.len = (size_t)d.buf.nbytes();
      o.peer = d.peer;
      o.tag = d.tag;
      ins.push_back(d.buf);
      keep.push_back(d.buf);
    }
    Target tg = (*items)[0].tg;
#ifdef UVCCL_TORCH2
    auto work = make_work(c10d::OpType::COALESCED, ins, {}, keep);
#else
    auto work = make_work(c10d::OpType::UNKNOWN, ins, {}, keep);
#endif
    // each operation's own Work ends with the batch (a receive's copy back
    // into a non-contiguous tensor runs then)
    auto end_each = [items](bool ok, const std::string& why) {
      for (auto& d : *items) {
        if (ok)
          d.work->complete(0, nullptr);
        else
          d.work->complete_exc(std::make_exception_ptr(std::runtime_error(why)));
      }
    };
    work->after = [end_each]() { end_each(true, ""); };
    work->hold.push_back(ops);
    work->getFuture()->addCallback([end_each](at::ivalue::Future& f) {
      if (f.hasError()) end_each(false, f.tryRetrieveErrorMessage());
    });
    for (auto& d : *items) d.work->cuda_dev = tg.dev;
    submit(work, tg, [g = tg.pg, ops](uvccl_work_t* w) {
      return uvccl_p2p_batch(g, w, ops->data(), ops->size(), on_done);
    });
    return work;
  }

  // ---- CUDA tensors ----
  //
  // Where every rank has its own GPU (no two share one) and NCCL loads,
  // CUDA tensors go through a uvccl NCCL group made beside the TCP group
  // at creation (mode "nccl"): each operation first makes the NCCL group's
  // stream wait for the caller's current stream (the kernels that wrote
  // the inputs), and completes once the GPU finished it. Elsewhere (ranks
  // sharing a GPU, no NCCL, UVCCL_TORCH_CUDA=staged) they go through the
  // TCP group, which stages device memory through pinned host memory
  // (mode "staged"): the caller's current stream is waited for first.
  // Either way wait() returns with the results in place (the host waits,
  // as Gloo's CUDA work does; NCCL's own backend waits on the stream
  // only), and the tensors stay referenced until the GPU is done with
  // them. What NCCL cannot do (BAND/BOR/BXOR) is staged on every rank
  // alike, so the ranks always agree on the transport.

  static bool nccl_can(const Redop& r) {
    return r.op != UVCCL_BAND && r.op != UVCCL_BOR && r.op != UVCCL_BXOR;
  }

  // Which group runs an operation on these tensors.
  Target target(const std::vector<at::Tensor>& ts, const char* op,
                bool nccl_ok = true) {
    Target tg{&pg_};
    bool any_cpu = false;
    for (auto& t : ts) {
      if (!t.defined()) continue;
      check_tensor(t, op);
      if (!t.is_cuda()) {
        any_cpu = true;
        continue;
      }
      int d = (int)t.device().index();
      TORCH_CHECK(tg.dev < 0 || tg.dev == d, "uvccl: ", op,
                  ": tensors on two devices (cuda:", tg.dev, ", cuda:", d, ")");
      tg.dev = d;
    }
    if (tg.dev < 0) return tg;
    TORCH_CHECK(!any_cpu, "uvccl: ", op, ": CPU and CUDA tensors mixed in one "
                "operation");
#ifdef UVCCL_TORCH_CUDA
    if (cuda_mode_ == kCudaNccl && nccl_ok) {
      TORCH_CHECK(tg.dev == cuda_dev_, "uvccl: ", op, ": tensors on cuda:",
                  tg.dev, ", but this rank's NCCL group is on cuda:", cuda_dev_,
                  " (the current device when the group was made: call "
                  "torch.cuda.set_device first)");
      tg.pg = &npg_;
      tg.nccl = true;
      return tg;
    }
    if (!gpu_loaded_) {  // the TCP group stages device memory once loaded
      int n = 0;
      int rc = uvccl_gpu_device_count(&n);
      const char* why = uvccl_gpu_unavailable_reason();
      TORCH_CHECK(rc == 0, "uvccl: ", op, ": CUDA tensors: ",
                  why ? why : uvccl_strerror(rc));
      gpu_loaded_ = true;
    }
    return tg;
#else
    TORCH_CHECK(false, "uvccl: ", op, ": CUDA tensors need the extension "
                "built against a PyTorch with CUDA");
#endif
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
  // for the loop, on tg's group. timeout: the options' (unset: the
  // group's).
  c10::intrusive_ptr<c10d::Work> submit(
      const c10::intrusive_ptr<WorkUVCCL>& work, const Target& tg, Step first,
      std::chrono::milliseconds timeout = c10d::kUnsetTimeout) {
    WorkUVCCL* raw = work.get();
    auto type = raw->retrieveOpType();
    if (type != c10d::OpType::SEND && type != c10d::OpType::RECV &&
        type != c10d::OpType::RECVANYSOURCE)
      seq_++;
    if (first) raw->steps.push_front(std::move(first));
    if (timeout.count() > 0) raw->timeout_ms = (uint64_t)timeout.count();
    if (coalescing_) coalesced_.push_back(work);
#ifdef UVCCL_TORCH_CUDA
    if (tg.dev >= 0) {
      raw->cuda_dev = tg.dev;
      auto cur = c10::cuda::getCurrentCUDAStream((c10::DeviceIndex)tg.dev);
      if (tg.nccl) {
        // the first step waits for the caller's stream (the steps after
        // it run on the same NCCL stream, so after it)
        raw->nccl = true;
        raw->stream = (void*)cur.stream();
        // one step and nothing to copy back: the caller's stream waits
        // for the operation rather than the host (see WorkUVCCL::wait)
        raw->stream_wait = raw->steps.size() == 1 && !raw->after;
        if (!raw->steps.empty()) {
          Step op = std::move(raw->steps.front());
          raw->steps.pop_front();
          uvccl_pg_t* g = tg.pg;
          raw->steps.push_front([raw, g, op](uvccl_work_t* w) {
            uvccl_work_t* dep = raw->side_work();
            c10::raw::intrusive_ptr::incref(raw);  // dep's, until on_dep
            int rc = uvccl_nccl_wait_stream(g, dep, raw->stream, on_dep);
            if (rc != 0) {
              c10::raw::intrusive_ptr::decref(raw);
              std::snprintf(w->msg, sizeof(w->msg), "%s",
                            dep->msg[0] ? dep->msg : uvccl_strerror(rc));
              return rc;
            }
            rc = op(w);
            if (rc != 0 || !raw->stream_wait) return rc;
            uvccl_work_t* ord = raw->side_work();
            c10::raw::intrusive_ptr::incref(raw);  // ord's, until on_ordered
            if (uvccl_nccl_stream_wait(g, ord, raw->stream, on_ordered) != 0) {
              c10::raw::intrusive_ptr::decref(raw);
              raw->set_ordered(-1);
            }
            return 0;
          });
        }
      } else {
        // staged: uvccl's device thread copies the inputs out, so the
        // kernels that wrote them must be done
        cur.synchronize();
      }
    }
#endif
    c10::raw::intrusive_ptr::incref(raw);  // the loop's, until on_done
    loop_->post([this, raw]() {
      if (!pg_up_) {
        raw->complete(UVCCL_ECLOSING, "the process group is shut down");
      } else {
        raw->start_next();
      }
      if (raw->isCompleted()) {  // refused at the call: no callback comes
        raw->release();
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
      if (npg_.impl_ != nullptr) {
        parts_++;
        npg_.data = this;
        uvccl_pg_destroy(&npg_, [](uvccl_pg_t* p) {
          static_cast<ProcessGroupUVCCL*>(p->data)->part_done();
        });
      }
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
  std::map<std::pair<uvccl_pg_t*, double>, uvccl_redop_t> premul_;
  std::atomic<uint64_t> seq_{0};
  uvccl_pg_t pg_;
  uvccl_pg_t mb_pg_;                 // monitoredBarrier's messages
  uvccl_pg_t npg_;                   // CUDA tensors' NCCL group (mode nccl)
  CudaMode cuda_mode_ = kCudaNone;
  int cuda_dev_ = -1;                // this rank's device, -1: none
  bool gpu_loaded_ = false;          // staging loaded (mode staged)
  // a coalescing block is open: its collectives, its deferred sends and
  // receives
  bool coalescing_ = false;
  std::vector<c10::intrusive_ptr<WorkUVCCL>> coalesced_;
  std::vector<Deferred> batch_;
  uint32_t mb_count_ = 0;
  uvccl_store_t store_;
  uvccl_store_server_t server_;
  std::string host_;
  uint64_t timeout_ms_ = 0;
  bool has_server_ = false, has_store_ = false, pg_up_ = false, shut_ = false;
  int parts_ = 0;
  std::promise<void>* part_done_ = nullptr;
};

}  // namespace uvccl_torch

PYBIND11_MODULE(_C, m) {
  m.doc() = "uvccl's c10d backend (see python/uvccl_torch/__init__.py)";
#ifdef UVCCL_TORCH_CUDA
  m.attr("cuda") = true;   // built against a PyTorch with CUDA
#else
  m.attr("cuda") = false;
#endif
  py::class_<uvccl_torch::ProcessGroupUVCCL, uvccl_torch::PGBase,
             c10::intrusive_ptr<uvccl_torch::ProcessGroupUVCCL>>(
      m, "ProcessGroupUVCCL")
      .def(py::init<const c10::intrusive_ptr<c10d::Store>&, int, int,
                    std::chrono::milliseconds, std::string, int, std::string,
                    bool>(),
           py::arg("store"), py::arg("rank"), py::arg("size"),
           py::arg("timeout"), py::arg("name") = "uvccl",
           py::arg("cuda_device") = -1, py::arg("cuda_id") = "",
           py::arg("nccl") = false,
           py::call_guard<py::gil_scoped_release>())
      .def("cuda_mode", &uvccl_torch::ProcessGroupUVCCL::cuda_mode,
           "How CUDA tensors travel: 'nccl' (a uvccl NCCL group), 'staged' "
           "(through pinned host memory over the TCP group) or 'none'.")
      .def("abort",
           static_cast<void (uvccl_torch::ProcessGroupUVCCL::*)(
               const std::string&)>(&uvccl_torch::ProcessGroupUVCCL::abort),
           py::arg("reason") = "aborted by its application",
           py::call_guard<py::gil_scoped_release>(),
           "Fails every pending operation of the group, here and on every "
           "other rank (with the reason); destroy the group after.");
}
