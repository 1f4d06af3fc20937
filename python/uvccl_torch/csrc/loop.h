// The binding's libuv loop: one per process, on a thread of its own.
#pragma once

#include "c10d.h"

namespace uvccl_torch {

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

}  // namespace uvccl_torch
