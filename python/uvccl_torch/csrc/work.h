// c10d Work objects of uvccl operations: WorkUVCCL (one operation, its
// steps on the loop), MultiWork (a coalescing block); finished from uvccl's
// callbacks (work.cpp).
#pragma once

#include "c10d.h"
#include "loop.h"

namespace uvccl_torch {

class WorkUVCCL;
void on_done(uvccl_work_t* w, int status);
#ifdef UVCCL_TORCH_CUDA
void on_dep(uvccl_work_t* w, int status);
void on_ordered(uvccl_work_t* w, int status);
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

#if UVCCL_TORCH_AT_LEAST(2, 6)
  // c10d's Work.get_future_result(): a WorkResult, never an error
  // (SUCCESS, TIMEOUT when the operation's timeout expired, COMM_ERROR for
  // any other failure of uvccl's, UNKNOWN for one of the copies back).
  c10::intrusive_ptr<c10::ivalue::Future> getFutureResult() override {
    return result_future_;
  }
#endif

  // the group's first failure (ProcessGroupUVCCL::getError): set by the
  // first of its operations to fail
  std::shared_ptr<std::atomic<int>> group_error;

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

  Loop* loop = nullptr;  // the loop it runs on (its spin budget)

  bool wait(std::chrono::milliseconds timeout =
                std::chrono::milliseconds(0)) override {  // 0: no limit
    // host tensors: this thread runs the loop for a while (see loop.h);
    // CUDA tensors' works leave it to the loop thread (their steps and
    // copies back set devices and streams there)
    if (loop != nullptr && cuda_dev < 0)
      loop->drive([this] { return ended_.load(std::memory_order_acquire); });
    look_for_end();
#ifdef UVCCL_TORCH_CUDA
    if (stream_wait) return wait_ordered(timeout);
#endif
    return c10d::Work::wait(timeout);
  }

  // Before a waiter sleeps: the operation's end for up to the loop's spin
  // budget (see loop.h), so that a short one costs the waiter no wake-up.
  void look_for_end() {
    uint32_t us = loop != nullptr ? loop->spin_us() : 0;
    if (us == 0 || ended_.load(std::memory_order_acquire)) return;
    uint64_t until = uv_hrtime() + (uint64_t)us * 1000;
    bool yields = loop->spin_yields();
    while (!ended_.load(std::memory_order_acquire) && uv_hrtime() < until) {
      if (yields)
        sched_yield();
      else
        Loop::cpu_relax();
    }
  }

#ifdef UVCCL_TORCH_CUDA
  bool wait_ordered(std::chrono::milliseconds timeout) {
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
      set_result(0);
      wake();
    } else {
      if (group_error) {
        int none = 0;
        group_error->compare_exchange_strong(none, status);
      }
      result_status_ = status;
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
    set_result(result_status_);
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
  // status: 0 done, a uvccl code, or 1 (not uvccl's: a copy back failed)
  void set_result(int status) {
#if UVCCL_TORCH_AT_LEAST(2, 6)
    c10d::WorkResult r = status == 0             ? c10d::WorkResult::SUCCESS
                         : status == UV_ETIMEDOUT ? c10d::WorkResult::TIMEOUT
                         : status < 0 ? c10d::WorkResult::COMM_ERROR
                                      : c10d::WorkResult::UNKNOWN;
    result_future_->markCompleted(c10::IValue(static_cast<int64_t>(r)));
#else
    (void)status;
#endif
  }

  void wake() {
    ended_.store(true, std::memory_order_release);
    { std::lock_guard<std::mutex> g(omu_); }
    ocv_.notify_all();
  }

  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<at::ivalue::Future> future_;
  std::vector<std::unique_ptr<uvccl_work_t>> ws_;
  std::mutex omu_;
  std::condition_variable ocv_;
  std::atomic<bool> ended_{false};  // finished, either way
  int result_status_ = 1;  // a failure's uvccl code (see set_result)
#if UVCCL_TORCH_AT_LEAST(2, 6)
  c10::intrusive_ptr<at::ivalue::Future> result_future_ =
      c10::make_intrusive<at::ivalue::Future>(c10::IntType::get());
#endif
  int ordered_ = 0;
};

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

}  // namespace uvccl_torch
