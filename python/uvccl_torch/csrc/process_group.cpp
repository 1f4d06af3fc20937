// uvccl as a PyTorch c10d backend (PyTorch 1.13's ProcessGroup API).
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
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <pybind11/chrono.h>

#include <uvccl.h>

#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace uvccl_torch {

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

static uvccl_redop_t redop_of(const c10d::ReduceOp& op) {
  switch (op) {
    case c10d::ReduceOp::SUM: return UVCCL_SUM;
    case c10d::ReduceOp::AVG: return UVCCL_AVG;
    case c10d::ReduceOp::PRODUCT: return UVCCL_PRODUCT;
    case c10d::ReduceOp::MIN: return UVCCL_MIN;
    case c10d::ReduceOp::MAX: return UVCCL_MAX;
    case c10d::ReduceOp::BAND: return UVCCL_BAND;
    case c10d::ReduceOp::BOR: return UVCCL_BOR;
    case c10d::ReduceOp::BXOR: return UVCCL_BXOR;
    default: break;
  }
  TORCH_CHECK(false, "uvccl: this ReduceOp is not supported yet");
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

// ---- work --------------------------------------------------------------------

class WorkUVCCL : public c10d::Work {
 public:
  WorkUVCCL(c10d::OpType type, std::vector<at::Tensor> outputs)
      : c10d::Work(-1, type),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<at::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()))) {
    std::memset(&w, 0, sizeof(w));
    w.data = this;
  }

  uvccl_work_t w;
  std::vector<at::Tensor> keep;      // buffers alive until completion
  std::function<void()> after;       // copies back (non-contiguous outputs)

  // On the loop thread: the operation ended.
  void complete(int status, const char* msg) {
    if (status == 0) {
      try {
        if (after) after();
      } catch (...) {
        auto e = std::current_exception();
        finish(e);
        future_->setError(e);
        return;
      }
      finish();
      future_->markCompleted(c10::IValue(outputs_));
    } else {
      auto e = std::make_exception_ptr(std::runtime_error(
          std::string("uvccl: ") + (msg && *msg ? msg : uvccl_strerror(status)) +
          " (" + uvccl_err_name(status) + ")"));
      finish(e);
      future_->setError(e);
    }
    keep.clear();
  }

  std::vector<at::Tensor> result() override { return outputs_; }
  int sourceRank() const override {
    TORCH_CHECK(source_ >= 0, "uvccl: sourceRank() is for recv_anysource");
    return source_;
  }
  int source_ = -1;   // recv from any source: the sender, once done
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    return future_;
  }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<at::ivalue::Future> future_;
};

static void on_done(uvccl_work_t* w, int status) {
  auto* work = static_cast<WorkUVCCL*>(w->data);
  if (status == 0 && work->source_ == -2) work->source_ = (int)w->result;
  work->complete(status, w->msg);
  c10::raw::intrusive_ptr::decref(work);  // the loop's reference
}

// ---- the process group -------------------------------------------------------

class ProcessGroupUVCCL : public c10d::ProcessGroup {
 public:
  ProcessGroupUVCCL(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                    int size, std::chrono::milliseconds timeout)
      : c10d::ProcessGroup(rank, size), loop_(Loop::get()) {
    std::memset(&pg_, 0, sizeof(pg_));
    std::memset(&store_, 0, sizeof(store_));
    std::memset(&server_, 0, sizeof(server_));
    timeout_ms_ = (uint64_t)timeout.count();
    std::string addr;
    if (rank == 0) {
      int port = loop_->call<int>([this]() {
        uvccl_store_server_options_t so;
        std::memset(&so, 0, sizeof(so));
        so.listen_fd = -1;
        int rc = uvccl_store_server_init(loop_->loop(), &server_, &so);
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
    pg_up_ = true;
  }

  ~ProcessGroupUVCCL() override { shutdown(); }

  const std::string getBackendName() const override { return "uvccl"; }

  // ---- collectives ----

  c10::intrusive_ptr<c10d::Work> broadcast(
      std::vector<at::Tensor>& tensors,
      const c10d::BroadcastOptions& opts) override {
    auto& t = single(tensors, "broadcast");
    auto buf = t.contiguous();
    auto work = make_work(c10d::OpType::BROADCAST, {t}, {buf}, t, buf);
    uvccl_dtype_t dt = dtype_of(t);
    int root = (int)opts.rootRank;
    return submit(work, [this, buf, dt, root](uvccl_work_t* w) {
      return uvccl_broadcast(&pg_, w, buf.data_ptr(), (size_t)buf.numel(), dt,
                             root, on_done);
    });
  }

  c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts) override {
    auto& t = single(tensors, "allreduce");
    auto buf = t.contiguous();
    auto work = make_work(c10d::OpType::ALLREDUCE, {t}, {buf}, t, buf);
    uvccl_dtype_t dt = dtype_of(t);
    uvccl_redop_t op = redop_of(opts.reduceOp);
    return submit(work, [this, buf, dt, op](uvccl_work_t* w) {
      return uvccl_allreduce(&pg_, w, buf.data_ptr(), buf.data_ptr(),
                             (size_t)buf.numel(), dt, op, on_done);
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce(
      std::vector<at::Tensor>& tensors,
      const c10d::ReduceOptions& opts) override {
    auto& t = single(tensors, "reduce");
    auto buf = t.contiguous();
    auto work = make_work(c10d::OpType::REDUCE, {t}, {buf}, t, buf);
    uvccl_dtype_t dt = dtype_of(t);
    uvccl_redop_t op = redop_of(opts.reduceOp);
    int root = (int)opts.rootRank;
    return submit(work, [this, buf, dt, op, root](uvccl_work_t* w) {
      return uvccl_reduce(&pg_, w, buf.data_ptr(), buf.data_ptr(),
                          (size_t)buf.numel(), dt, op, root, on_done);
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions&) override {
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
    auto work = make_work(c10d::OpType::ALLGATHER, outs, {src, flat});
    work->after = [outs, flat, n = in.numel()]() mutable {
      for (size_t i = 0; i < outs.size(); i++)
        outs[i].copy_(flat.narrow(0, (int64_t)i * n, n).view(outs[i].sizes()));
    };
    uvccl_dtype_t dt = dtype_of(in);
    return submit(work, [this, src, flat, dt](uvccl_work_t* w) {
      return uvccl_allgather(&pg_, w, src.data_ptr(), flat.data_ptr(),
                             (size_t)src.numel(), dt, on_done);
    });
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::AllgatherOptions&) override {
    check_cpu(input, "_allgather_base");
    check_cpu(output, "_allgather_base");
    TORCH_CHECK(output.numel() == input.numel() * getSize(),
                "uvccl: _allgather_base: the output must hold size x input");
    auto src = input.contiguous();
    auto dst = output.contiguous();
    auto work = make_work(c10d::OpType::_ALLGATHER_BASE, {output}, {src, dst},
                          output, dst);
    uvccl_dtype_t dt = dtype_of(input);
    return submit(work, [this, src, dst, dt](uvccl_work_t* w) {
      return uvccl_allgather(&pg_, w, src.data_ptr(), dst.data_ptr(),
                             (size_t)src.numel(), dt, on_done);
    });
  }

  c10::intrusive_ptr<c10d::Work> barrier(
      const c10d::BarrierOptions&) override {
    auto work = make_work(c10d::OpType::BARRIER, {}, {});
    return submit(work, [this](uvccl_work_t* w) {
      return uvccl_barrier(&pg_, w, on_done);
    });
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors,
                                      int dst, int tag) override {
    auto& t = single(tensors, "send");
    auto buf = t.contiguous();
    auto work = make_work(c10d::OpType::SEND, {t}, {buf});
    size_t n = (size_t)buf.nbytes();
    return submit(work, [this, buf, n, dst, tag](uvccl_work_t* w) {
      return uvccl_send(&pg_, w, buf.data_ptr(), n, dst, tag, on_done);
    });
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors,
                                      int src, int tag) override {
    auto& t = single(tensors, "recv");
    auto buf = t.contiguous();
    auto work = make_work(c10d::OpType::RECV, {t}, {buf}, t, buf);
    size_t n = (size_t)buf.nbytes();
    return submit(work, [this, buf, n, src, tag](uvccl_work_t* w) {
      return uvccl_recv(&pg_, w, buf.data_ptr(), n, src, tag, on_done);
    });
  }

  c10::intrusive_ptr<c10d::Work> recvAnysource(
      std::vector<at::Tensor>& tensors, int tag) override {
    auto& t = single(tensors, "recv");
    auto buf = t.contiguous();
    auto work = make_work(c10d::OpType::RECVANYSOURCE, {t}, {buf}, t, buf);
    work->source_ = -2;  // filled in by on_done
    size_t n = (size_t)buf.nbytes();
    return submit(work, [this, buf, n, tag](uvccl_work_t* w) {
      return uvccl_recv(&pg_, w, buf.data_ptr(), n, UVCCL_ANY_SOURCE, tag,
                        on_done);
    });
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts) override {
    TORCH_CHECK(!tensors.empty(), "uvccl: allreduce_coalesced: no tensors");
    for (auto& t : tensors) {
      check_cpu(t, "allreduce_coalesced");
      TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type(),
                  "uvccl: allreduce_coalesced: tensors of one dtype");
    }
    // one flat buffer: one operation, then the pieces go back
    std::vector<at::Tensor> flats;
    for (auto& t : tensors) flats.push_back(t.reshape(-1));
    auto flat = at::cat(flats);
    auto outs = tensors;
    auto work = make_work(c10d::OpType::ALLREDUCE_COALESCED, outs, {flat});
    work->after = [outs, flat]() mutable {
      int64_t off = 0;
      for (auto& o : outs) {
        o.copy_(flat.narrow(0, off, o.numel()).view(o.sizes()));
        off += o.numel();
      }
    };
    uvccl_dtype_t dt = dtype_of(tensors[0]);
    uvccl_redop_t op = redop_of(opts.reduceOp);
    return submit(work, [this, flat, dt, op](uvccl_work_t* w) {
      return uvccl_allreduce(&pg_, w, flat.data_ptr(), flat.data_ptr(),
                             (size_t)flat.numel(), dt, op, on_done);
    });
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
    auto work = make_work(c10d::OpType::GATHER, outs, {src});
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
    });
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
    auto work = make_work(c10d::OpType::SCATTER, {out}, {dst}, out, dst);
    if (me) work->keep.push_back(flat);
    uvccl_dtype_t dt = dtype_of(out);
    return submit(work, [this, flat, dst, dt, root](uvccl_work_t* w) {
      return uvccl_scatter(&pg_, w, flat.defined() ? flat.data_ptr() : nullptr,
                           dst.data_ptr(), (size_t)dst.numel(), dt, root,
                           on_done);
    });
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
    auto work = make_work(c10d::OpType::REDUCE_SCATTER, {out}, {flat, dst}, out,
                          dst);
    uvccl_dtype_t dt = dtype_of(out);
    uvccl_redop_t op = redop_of(opts.reduceOp);
    return submit(work, [this, flat, dst, dt, op](uvccl_work_t* w) {
      return uvccl_reduce_scatter(&pg_, w, flat.data_ptr(), dst.data_ptr(),
                                  (size_t)dst.numel(), dt, op, on_done);
    });
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
    auto work = make_work(c10d::OpType::_REDUCE_SCATTER_BASE, {output},
                          {src, dst}, output, dst);
    uvccl_dtype_t dt = dtype_of(output);
    uvccl_redop_t op = redop_of(opts.reduceOp);
    return submit(work, [this, src, dst, dt, op](uvccl_work_t* w) {
      return uvccl_reduce_scatter(&pg_, w, src.data_ptr(), dst.data_ptr(),
                                  (size_t)dst.numel(), dt, op, on_done);
    });
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(
      at::Tensor& output, at::Tensor& input,
      std::vector<int64_t>& outSplits, std::vector<int64_t>& inSplits,
      const c10d::AllToAllOptions&) override {
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
    auto work = make_work(c10d::OpType::ALLTOALL_BASE, {output}, {src, dst},
                          output, dst);
    uvccl_dtype_t dt = dtype_of(input);
    return submit(work, [this, src, dst, sc, rc, dt](uvccl_work_t* w) {
      return uvccl_alltoallv(&pg_, w, src.data_ptr(), sc->data(),
                             dst.data_ptr(), rc->data(), dt, on_done);
    });
  }

  c10::intrusive_ptr<c10d::Work> alltoall(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllToAllOptions&) override {
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
    auto work = make_work(c10d::OpType::ALLTOALL, outs, {src, dst});
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
    });
  }

  // c10d's monitored_barrier: rank 0 waits for every rank within the
  // timeout and names the ones that did not come.
  void monitoredBarrier(const c10d::BarrierOptions& opts,
                        bool waitAllRanks) override {
    auto work = make_work(c10d::OpType::BARRIER, {}, {});
    // unset (-1): the group's timeout
    uint64_t t = opts.timeout.count() > 0 ? (uint64_t)opts.timeout.count() : 0;
    bool all = waitAllRanks;
    submit(work, [this, t, all](uvccl_work_t* w) {
      w->timeout_ms = t;
      return uvccl_monitored_barrier(&pg_, w, all ? 1 : 0, on_done);
    });
    work->wait();
  }

 private:
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
      c10d::OpType type, std::vector<at::Tensor> outputs,
      std::vector<at::Tensor> keep, at::Tensor user = at::Tensor(),
      at::Tensor buf = at::Tensor()) {
    auto work = c10::make_intrusive<WorkUVCCL>(type, std::move(outputs));
    work->keep = std::move(keep);
    if (user.defined() && buf.defined() && !user.is_same(buf))
      work->after = [user, buf]() mutable { user.copy_(buf); };
    return work;
  }

  c10::intrusive_ptr<c10d::Work> submit(
      const c10::intrusive_ptr<WorkUVCCL>& work,
      std::function<int(uvccl_work_t*)> start) {
    WorkUVCCL* raw = work.get();
    c10::raw::intrusive_ptr::incref(raw);  // the loop's, until on_done
    loop_->post([this, raw, start]() {
      int rc;
      if (!pg_up_) {
        raw->complete(UVCCL_ECLOSING, "the process group is shut down");
        c10::raw::intrusive_ptr::decref(raw);
        return;
      }
      rc = start(&raw->w);
      if (rc != 0) {  // refused at the call: no callback comes
        raw->complete(rc, raw->w.msg);
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
    f.wait();
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
  uvccl_pg_t pg_;
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
  py::class_<uvccl_torch::ProcessGroupUVCCL, c10d::ProcessGroup,
             c10::intrusive_ptr<uvccl_torch::ProcessGroupUVCCL>>(
      m, "ProcessGroupUVCCL")
      .def(py::init<const c10::intrusive_ptr<c10d::Store>&, int, int,
                    std::chrono::milliseconds>(),
           py::call_guard<py::gil_scoped_release>());
}
