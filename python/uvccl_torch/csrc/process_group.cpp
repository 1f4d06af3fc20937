// The process group's life: creation (the store server on rank 0, the
// uvccl groups, how CUDA tensors travel), abort and shutdown.
#include "process_group.h"

namespace uvccl_torch {

ProcessGroupUVCCL::ProcessGroupUVCCL(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout, std::string name, int cuda_device,
    std::string cuda_id, bool nccl_ok, std::string host, bool deferred)
    : PGBase(rank, size), loop_(Loop::get()), name_(std::move(name)) {
  std::memset(&pg_, 0, sizeof(pg_));
  std::memset(&mb_pg_, 0, sizeof(mb_pg_));
  std::memset(&npg_, 0, sizeof(npg_));
  std::memset(&store_, 0, sizeof(store_));
  std::memset(&server_, 0, sizeof(server_));
  timeout_ms_ = (uint64_t)timeout.count();
  c10d_store_ = store;
  cuda_device_arg_ = cuda_device;
  cuda_id_ = std::move(cuda_id);
  nccl_ok_ = nccl_ok;
  host_arg_ = std::move(host);
  {
    char h[128] = "";
    gethostname(h, sizeof(h) - 1);
    static std::atomic<int> made{0};
    ident_ = std::to_string(rank) + ":" + h + ":" + std::to_string(getpid()) +
             "." + std::to_string(made++);
  }
  if (deferred) return;  // the world comes with reconfigure()
  connect(store, rank, size);
}

void ProcessGroupUVCCL::connect(const c10::intrusive_ptr<c10d::Store>& store,
                                int rank, int size) {
  std::string addr;
  if (rank == 0) {
    std::string bind = publish_host(host_arg_);
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
    addr = bind + ":" + std::to_string(port);
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
    teardown();
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
    teardown();
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
    teardown();
    TORCH_CHECK(false, "uvccl: creating the group: ", uvccl_strerror(rc));
  }
  pg_up_ = true;
  loop_->set_local_ranks(loop_->call<int>([this, rank, size]() {
    return local_ranks(rank, size);
  }));
  try {
    setup_cuda(cuda_device_arg_, cuda_id_, nccl_ok_);
  } catch (...) {
    teardown();
    throw;
  }
}

// On the loop: the ranks whose address has this rank's host part (how
// many threads of this job may want a CPU here).
int ProcessGroupUVCCL::local_ranks(int rank, int size) {
  auto host = [](const char* a) {
    std::string s = a != nullptr ? a : "";
    auto colon = s.rfind(':');
    return colon == std::string::npos ? s : s.substr(0, colon);
  };
  std::string me = host(uvccl_pg_peer_address(&pg_, rank));
  int n = 0;
  for (int r = 0; r < size; r++)
    if (r == rank || host(uvccl_pg_peer_address(&pg_, r)) == me) n++;
  return n;
}

std::string ProcessGroupUVCCL::cuda_mode() const {
  return cuda_mode_ == kCudaNccl ? "nccl"
         : cuda_mode_ == kCudaStaged ? "staged" : "none";
}

ProcessGroupUVCCL::~ProcessGroupUVCCL() { shutdown(); }

const std::string ProcessGroupUVCCL::getBackendName() const { return name_; }

void ProcessGroupUVCCL::abort() { abort("aborted by its application"); }

// Never waits: the loop takes it at its next turn (before a shutdown
// posted after it), so it can be called from any thread, a timer's or a
// signal-driven one's, while the caller's thread is stuck in wait() or
// holds the GIL that a callback on the loop thread waits for.
void ProcessGroupUVCCL::abort(const std::string& reason) {
  loop_->post([this, reason]() {
    if (pg_up_) uvccl_pg_abort(&pg_, reason.c_str());
    if (pg_up_ && npg_.impl_ != nullptr)
      uvccl_pg_abort(&npg_, reason.c_str());
  });
}

#if UVCCL_TORCH_AT_LEAST(2, 14)
c10d::ErrorType ProcessGroupUVCCL::getError() {
  int e = first_error();
  if (e == 0) return c10d::ErrorType::SUCCESS;
  return e == UV_ETIMEDOUT ? c10d::ErrorType::TIMEOUT
                           : c10d::ErrorType::COMM_ERROR;
}

void ProcessGroupUVCCL::setTimeout(std::chrono::milliseconds timeout) {
  TORCH_CHECK(timeout.count() > 0, "uvccl: setTimeout: the timeout must be "
              "positive");
  uint64_t ms = (uint64_t)timeout.count();
  loop_->call<int>([this, ms]() {
    timeout_ms_ = ms;
    if (pg_up_) {
      uvccl_pg_set_timeout(&pg_, ms);
      uvccl_pg_set_timeout(&mb_pg_, ms);
      if (npg_.impl_ != nullptr) uvccl_pg_set_timeout(&npg_, ms);
    }
    return 0;
  });
}
#endif

void ProcessGroupUVCCL::setSequenceNumberForGroup() { seq_ = 0; }

uint64_t ProcessGroupUVCCL::getSequenceNumberForGroup() { return seq_.load(); }

int ProcessGroupUVCCL::blocking(
    std::function<int(uvccl_work_t*, uvccl_work_cb)> start, std::string* msg) {
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

void ProcessGroupUVCCL::setup_cuda(int dev, const std::string& id,
                                   bool nccl_ok) {
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
  nccl_has_store_ = true;
}

std::string ProcessGroupUVCCL::publish_host(const std::string& host) {
  if (!host.empty()) return host;
  const char* m = getenv("MASTER_ADDR");
  if (m != nullptr && *m != '\0') return m;
  char h[256];
  if (gethostname(h, sizeof(h)) == 0) {
    h[sizeof(h) - 1] = '\0';
    return h;
  }
  return "127.0.0.1";
}

void ProcessGroupUVCCL::shutdown() {
  if (shut_) return;
  shut_ = true;
  teardown();
}

void ProcessGroupUVCCL::teardown() {
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
  // what else belonged to that world (a reconfigure makes another; its
  // handles were cleared on the loop, in part_done)
  cuda_mode_ = kCudaNone;
  nccl_has_store_ = false;
  mb_count_ = 0;
  seq_ = 0;
  error_->store(0);
}

void ProcessGroupUVCCL::part_done() {
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
  // every part is closed: the handles are free for another world
  std::memset(&pg_, 0, sizeof(pg_));
  std::memset(&mb_pg_, 0, sizeof(mb_pg_));
  std::memset(&npg_, 0, sizeof(npg_));
  std::memset(&store_, 0, sizeof(store_));
  std::memset(&server_, 0, sizeof(server_));
  premul_.clear();
  part_done_->set_value();
}

}  // namespace uvccl_torch
