// The binding's libuv loop: one per process, on a thread of its own.
//
// A call hands its operation to the loop thread and waits for its end: two
// hand-offs between threads. A thread asleep takes tens of microseconds to
// wake on a virtual machine (more than a whole small collective), so each
// side looks for the other's news for a while before it sleeps: the loop,
// after a task or an operation's end, keeps polling (an idle handle: the
// loop turns without blocking, its I/O served) for the next task, which
// then needs no uv_async_send; a waiter looks at its Work before it blocks
// (WorkUVCCL::wait). Both only while there are CPUs for them (see spin_us).
//
// Better still, the waiter runs the loop itself for that while (drive):
// whoever holds run_mu_ runs the loop, one thread at a time, so the tasks
// posted and the operation's I/O and callbacks run on the waiting thread,
// and a small operation ends with no hand-off at all (where a rank's two
// threads share a CPU, each hand-off costs a context switch). The loop
// thread gives run_mu_ up between its turns when a waiter wants it (want_),
// and is woken out of a blocking turn for it (in_once_, idle_polls_).
#pragma once

#include <sched.h>

#include <algorithm>
#include <condition_variable>
#include <thread>

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
    // the last task: with the handles closed the loop runs dry
    post([this] {
      idle_polls_.store(false);
      uv_close(reinterpret_cast<uv_handle_t*>(&async_), nullptr);
      uv_close(reinterpret_cast<uv_handle_t*>(&spin_), nullptr);
      spin_us_.store(0);
    });
    thread_.join();
    uv_loop_close(&loop_);
  }

  uv_loop_t* loop() { return &loop_; }

  // Runs fn on the loop thread, in the order posted.
  void post(std::function<void()> fn) {
    bool wake;
    {
      std::lock_guard<std::mutex> g(mu_);
      tasks_.push_back(std::move(fn));
      wake = !spinning_;
      queued_.store(true, std::memory_order_release);
    }
    if (wake) uv_async_send(&async_);
    // the loop thread, parked (see run), resumes at once for a task of
    // another thread's, or of the last driver's once the park it was given
    // is over; before that, the last driver's own is likelier to be driven
    // by its wait
    if (parked_.load()) {
      uint64_t at = resume_ns_.load();
      if (last_driver_.load() != std::this_thread::get_id() || at == 0 ||
          uv_hrtime() >= at) {
        {
          std::lock_guard<std::mutex> pk(park_mu_);
          resume_ns_.store(0);
        }
        park_cv_.notify_one();
      }
    }
  }

  // How long either side of a hand-off looks for the other's news before
  // it sleeps, in microseconds (0: it sleeps at once). $UVCCL_TORCH_SPIN_US
  // (default 50, longer than a wake-up takes). Each rank has two threads
  // that spin (its caller and its loop): where the ranks of this host
  // (local_ranks) have fewer than two CPUs each, a spinning thread gives
  // its CPU away each turn (spin_yields), so that a thread awaited on the
  // same CPU runs at once; with fewer than one CPU each nobody spins (the
  // spinners' turns would delay the threads awaited).
  // $UVCCL_BUSY_POLL_FORCE=1 spins anyway, as for uvccl's own busy polling.
  uint32_t spin_us() const { return spin_us_.load(std::memory_order_relaxed); }
  bool spin_yields() const {
    return spin_yields_.load(std::memory_order_relaxed);
  }

  // A group of `local` ranks on this host was made (the largest decides).
  void set_local_ranks(int local) {
    std::lock_guard<std::mutex> g(mu_);
    if (local > local_ranks_) local_ranks_ = local;
    set_spin(local_ranks_);
  }

  // On the loop (whichever thread runs it): a task ran or an operation
  // ended; its caller may hand over the next one soon.
  void kick() {
    uint32_t us = spin_us();
    if (us == 0) return;
    spin_until_ = uv_hrtime() + (uint64_t)us * 1000;
    if (!uv_is_active(reinterpret_cast<uv_handle_t*>(&spin_))) {
      {
        std::lock_guard<std::mutex> g(mu_);
        spinning_ = true;
      }
      idle_polls_.store(true);
      uv_idle_start(&spin_, on_spin);
    }
  }

  // Runs the loop on the calling thread until done() or the spin budget is
  // spent (whichever first), the tasks posted before included. Not where
  // nobody spins, nor on the thread running the loop already (a callback
  // waiting: that waits as before). When done, the loop thread stays
  // parked for another spin budget unless a task comes from another
  // thread: a caller whose next operation follows soon (a loop of
  // blocking collectives) drives that one too, without a hand-off.
  template <typename Done>
  void drive(Done done) {
    uint32_t us = spin_us();
    std::thread::id me = std::this_thread::get_id();
    if (us == 0 || done() || driver_.load() == me) return;
    want_.fetch_add(1);
    // a turn that may block in the kernel is woken (one that polls ends
    // by itself; on_spin looks at want_ when it stops polling)
    if (in_once_.load() && !idle_polls_.load()) uv_async_send(&async_);
    uint64_t until = uv_hrtime() + (uint64_t)us * 1000;
    bool yields = spin_yields();
    bool ended;
    // the loop thread's turn ends soon; never blocked on it, though: the
    // operation may end in that turn, and a callback of that turn may
    // wait for something this thread holds (the GIL)
    std::unique_lock<std::mutex> lk(run_mu_, std::defer_lock);
    while (!lk.try_lock()) {
      if (done() || uv_hrtime() >= until) {
        {
          std::lock_guard<std::mutex> pk(park_mu_);
          want_.fetch_sub(1);
        }
        park_cv_.notify_one();
        return;
      }
      if (yields)
        sched_yield();
      else
        cpu_relax();
    }
    {
      driver_.store(me);
      run_tasks();
      while (!(ended = done()) && uv_hrtime() < until) {
        uv_run(&loop_, UV_RUN_NOWAIT);
        if (yields && !done()) sched_yield();
      }
      driver_.store(std::thread::id());
      last_driver_.store(me);
      lk.unlock();
    }
    {
      std::lock_guard<std::mutex> pk(park_mu_);
      resume_ns_.store(ended ? uv_hrtime() + (uint64_t)us * 1000 : 0);
      want_.fetch_sub(1);
    }
    if (!ended) park_cv_.notify_one();
  }

  static void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
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
    uv_idle_init(&loop_, &spin_);
    spin_.data = this;
    set_spin(1);
    thread_ = std::thread([this] { run(); });
  }

  // The loop thread: turns of the loop, each with run_mu_, parked while a
  // waiter drives or wants to and for a while after a drive (see drive).
  // It never sleeps on run_mu_ itself, so a driver's release wakes
  // nobody. Parked for a waiter, it looks again after kParkLookNs at most
  // (a post or a drive that did not finish wakes it sooner): that bounds
  // how long an operation the last driver posts right after its drive
  // (an asynchronous one, waited for later) waits for the loop thread,
  // and costs the loop thread a wake-up that often while waiters drive.
  static constexpr uint64_t kParkLookNs = 200000;
  void run() {
    std::thread::id me = std::this_thread::get_id();
    for (;;) {
      for (;;) {
        std::unique_lock<std::mutex> pk(park_mu_);
        uint64_t now = uv_hrtime(), at = resume_ns_.load();
        uint64_t look = now + kParkLookNs;
        if (want_.load() == 0) {
          if (at == 0 || now >= at) {
            pk.unlock();
            if (run_mu_.try_lock()) break;
            pk.lock();
          } else {
            look = at;
          }
        }
        parked_.store(true);
        park_cv_.wait_for(pk, std::chrono::nanoseconds(look - now));
        parked_.store(false);
      }
      resume_ns_.store(0);
      driver_.store(me);
      in_once_.store(true);
      int alive = 1;
      if (want_.load() == 0)  // (else a waiter that saw in_once_ false)
        alive = uv_run(&loop_, UV_RUN_ONCE);
      in_once_.store(false);
      driver_.store(std::thread::id());
      run_mu_.unlock();
      if (!alive) break;
    }
  }

  // Sets the spin budget for `local_ranks` ranks on this host.
  void set_spin(int local_ranks) {
    const char* v = std::getenv("UVCCL_TORCH_SPIN_US");
    const char* force = std::getenv("UVCCL_BUSY_POLL_FORCE");
    uint32_t us = 50;
    if (v != nullptr && *v != '\0') {
      char* end;
      unsigned long n = std::strtoul(v, &end, 10);
      if (*end == '\0' && n <= 1000000) us = (uint32_t)n;
    }
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    bool forced = force != nullptr && std::strcmp(force, "1") == 0;
    bool yields = false;
    if (!forced && ncpu > 0 && 2L * local_ranks > ncpu) {
      if (local_ranks > ncpu) us = 0;
      yields = true;
    }
    spin_yields_.store(yields, std::memory_order_relaxed);
    spin_us_.store(us, std::memory_order_relaxed);
  }

  void run_tasks() {
    std::deque<std::function<void()>> run;
    {
      std::lock_guard<std::mutex> g(mu_);
      run.swap(tasks_);
      queued_.store(false, std::memory_order_relaxed);
    }
    for (auto& fn : run) fn();
    if (!run.empty()) kick();
  }

  static void on_async(uv_async_t* a) { static_cast<Loop*>(a->data)->run_tasks(); }

  // Each loop turn while spinning: the tasks posted since, else the end
  // of the window (then a last look under the lock, since a post that saw
  // spinning_ set sent no wake-up).
  static void on_spin(uv_idle_t* h) {
    auto* self = static_cast<Loop*>(h->data);
    if (self->queued_.load(std::memory_order_acquire)) {
      self->run_tasks();
      return;
    }
    if (uv_hrtime() < self->spin_until_) {
      if (self->spin_yields()) sched_yield();
      return;
    }
    {
      std::lock_guard<std::mutex> g(self->mu_);
      if (self->tasks_.empty()) {
        self->spinning_ = false;
        uv_idle_stop(h);
        // this turn may now block: a waiter that saw it polling sent no
        // wake-up (the seq_cst pair with drive's)
        self->idle_polls_.store(false);
        if (self->want_.load() > 0) uv_stop(&self->loop_);
        return;
      }
    }
    self->run_tasks();
  }

  uv_loop_t loop_;
  uv_async_t async_;
  uv_idle_t spin_;
  std::thread thread_;
  std::mutex mu_;
  std::deque<std::function<void()>> tasks_;
  std::atomic<bool> queued_{false};  // tasks_ is not empty (a hint)
  bool spinning_ = false;            // (mu_) the loop polls: no wake-up
  uint64_t spin_until_ = 0;          // (run_mu_) when the window ends
  int local_ranks_ = 1;              // (mu_)
  std::atomic<uint32_t> spin_us_{0};
  std::atomic<bool> spin_yields_{false};
  // Who runs the loop (see drive and run): the holder of run_mu_; waiters
  // that want it (changed under park_mu_ as they leave); whether the loop
  // thread is in a turn, and whether that turn polls (the idle handle)
  // rather than blocks.
  std::mutex run_mu_;
  std::mutex park_mu_;  // the loop thread's park (want_, resume_ns_)
  std::condition_variable park_cv_;
  std::atomic<int> want_{0};
  std::atomic<bool> in_once_{false};
  std::atomic<bool> idle_polls_{false};
  std::atomic<std::thread::id> driver_{};
  // After a drive that ended its operation: the loop thread stays parked
  // until resume_ns_ (0: not), unless a task comes from a thread other
  // than last_driver_.
  std::atomic<uint64_t> resume_ns_{0};
  std::atomic<bool> parked_{false};
  std::atomic<std::thread::id> last_driver_{};
};

}  // namespace uvccl_torch
