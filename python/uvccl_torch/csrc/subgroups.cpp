// Groups made from a group's connections: c10d's split_group and
// shrink_group (PyTorch 2.14's Backend::split and Backend::shrink), on
// uvccl_pg_split and uvccl_pg_shrink_excluding. Neither needs a store nor
// opens a socket: the child shares the parent's connections (uvccl counts
// its users), so it may outlive the parent, as c10d's shrink_group asks.
#include "process_group.h"

#include <algorithm>

namespace uvccl_torch {

ProcessGroupUVCCL::ProcessGroupUVCCL(ProcessGroupUVCCL& parent, int rank,
                                     int size,
                                     std::chrono::milliseconds timeout,
                                     const char* what, const MakeFn& make)
    : PGBase(rank, size), loop_(parent.loop_), name_(parent.name_) {
  std::memset(&pg_, 0, sizeof(pg_));
  std::memset(&mb_pg_, 0, sizeof(mb_pg_));
  std::memset(&npg_, 0, sizeof(npg_));
  std::memset(&store_, 0, sizeof(store_));
  std::memset(&server_, 0, sizeof(server_));
  timeout_ms_ = timeout.count() > 0 ? (uint64_t)timeout.count()
                                    : parent.timeout_ms_;
  std::string msg;
  int rc = blocking([&parent, &make, this](uvccl_work_t* w, uvccl_work_cb cb) {
    w->timeout_ms = timeout_ms_;
    return make(&parent.pg_, &pg_, w, cb);
  }, &msg);
  if (rc == 0 && (pg_.rank != rank || pg_.size != size)) {
    // the others decided another group (a shrink: a rank that failed
    // meanwhile is left out too): name who uvccl knows to have failed
    std::string failed = loop_->call<std::string>([&parent]() {
      int f[64];
      int n = uvccl_pg_failed_ranks(&parent.pg_, f, 64);
      std::string s;
      for (int i = 0; i < n && i < 64; i++)
        s += (i ? ", " : "") + std::to_string(f[i]);
      return s;
    });
    msg = "the ranks made a group of " + std::to_string(pg_.size) +
          " where " + std::to_string(size) + " were expected" +
          (failed.empty() ? std::string()
                          : " (failed meanwhile: rank " + failed +
                                "; shrink again excluding them too)");
    rc = UVCCL_EPEER;
  }
  if (rc == 0) {
    rc = loop_->call<int>([this, size]() {
      std::vector<int> all(size);
      for (int i = 0; i < size; i++) all[i] = i;
      uvccl_pg_set_timeout(&pg_, timeout_ms_);
      return uvccl_pg_new_group(&pg_, &mb_pg_, all.data(), size, nullptr);
    });
    if (rc != 0) msg = uvccl_strerror(rc);
  }
  if (rc == 0 && parent.cuda_mode_ == kCudaNccl) {
    rc = blocking([&parent, &make, this](uvccl_work_t* w, uvccl_work_cb cb) {
      w->timeout_ms = timeout_ms_;
      return make(&parent.npg_, &npg_, w, cb);
    }, &msg);
    if (rc != 0) msg = "the NCCL group for CUDA tensors: " + msg;
  }
  if (rc != 0) {
    shutdown();
    // uvccl's own message may already name the operation
    std::string head = std::string(what) + ": ";
    TORCH_CHECK(false, "uvccl: ", msg.compare(0, head.size(), head) == 0
                                      ? msg : head + msg);
  }
  pg_up_ = true;
  cuda_mode_ = parent.cuda_mode_;
  cuda_dev_ = parent.cuda_dev_;
  gpu_loaded_ = parent.gpu_loaded_;
}

#if UVCCL_TORCH_AT_LEAST(2, 14)
c10::intrusive_ptr<c10d::Backend::Options>
ProcessGroupUVCCL::getBackendOptions() {
  return c10::make_intrusive<Options>(
      name_, std::chrono::milliseconds((int64_t)timeout_ms_));
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupUVCCL::split(
    const c10::intrusive_ptr<c10d::Store>& store,
    const std::vector<int>& ranks, const c10::intrusive_ptr<Options>& opts) {
  (void)store;  // the parent's connections carry the child
  int me = getRank(), n = getSize();
  for (int r : ranks)
    TORCH_CHECK(r >= 0 && r < n, "uvccl: split: rank ", r,
                " is not in the parent group (", n, " ranks)");
  auto at = std::find(ranks.begin(), ranks.end(), me);
  int key = at == ranks.end() ? -1 : (int)(at - ranks.begin());
  // The ranks of one new group name it the same way on each of them (its
  // lowest parent rank), and the groups are disjoint: that rank is the
  // color. key: the place in the list, so the order given is kept.
  int color = key < 0 ? -1 : *std::min_element(ranks.begin(), ranks.end());
  auto make = [color, key](uvccl_pg_t* from, uvccl_pg_t* to, uvccl_work_t* w,
                           uvccl_work_cb cb) {
    return uvccl_pg_split(from, to, color, key < 0 ? 0 : key, w, cb);
  };
  if (key < 0) {  // in no new group: still takes part, as every rank must
    for (uvccl_pg_t* from : {&pg_, cuda_mode_ == kCudaNccl ? &npg_ : nullptr}) {
      if (from == nullptr) continue;
      uvccl_pg_t none;
      std::memset(&none, 0, sizeof(none));
      std::string msg;
      int rc = blocking([&](uvccl_work_t* w, uvccl_work_cb cb) {
        return make(from, &none, w, cb);
      }, &msg);
      TORCH_CHECK(rc == UVCCL_ENOTMEMBER || rc == 0, "uvccl: split: ", msg);
    }
    return nullptr;
  }
  auto timeout = opts ? opts->timeout : std::chrono::milliseconds(0);
  return c10::make_intrusive<ProcessGroupUVCCL>(
      *this, key, (int)ranks.size(), timeout, "split", make);
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupUVCCL::shrink(
    const std::vector<int64_t>& ranks_to_exclude, int shrink_flags,
    const c10::intrusive_ptr<Options>& opts_override) {
  int me = getRank(), n = getSize();
  std::vector<int> ex;
  for (int64_t r : ranks_to_exclude) {
    TORCH_CHECK(r >= 0 && r < n, "uvccl: shrink: rank ", r,
                " is not in the group (", n, " ranks)");
    TORCH_CHECK(r != me, "uvccl: shrink: this rank (", me, ") is in the "
                "list of ranks to exclude: only the others call shrink");
    ex.push_back((int)r);
  }
  std::sort(ex.begin(), ex.end());
  ex.erase(std::unique(ex.begin(), ex.end()), ex.end());
  TORCH_CHECK(!ex.empty(), "uvccl: shrink: no rank to exclude");
  TORCH_CHECK(shrink_flags == 0 || shrink_flags == 1, "uvccl: shrink: "
              "unknown flags ", shrink_flags, " (SHRINK_DEFAULT 0 or "
              "SHRINK_ABORT 1)");
  TORCH_CHECK(cuda_mode_ != kCudaNccl || nccl_has_store_, "uvccl: shrink: "
              "this group's CUDA tensors go through an NCCL group made by "
              "split or shrink, which has no store to agree through: shrink "
              "the world group instead");
  if (shrink_flags == 1) {  // SHRINK_ABORT: the pending operations end first
    loop_->call<int>([this]() {
      uvccl_pg_revoke(&pg_, "shrink_group(SHRINK_ABORT)");
      if (npg_.impl_ != nullptr)
        uvccl_pg_revoke(&npg_, "shrink_group(SHRINK_ABORT)");
      return 0;
    });
  }
  int below = (int)(std::lower_bound(ex.begin(), ex.end(), me) - ex.begin());
  auto timeout =
      opts_override ? opts_override->timeout : std::chrono::milliseconds(0);
  return c10::make_intrusive<ProcessGroupUVCCL>(
      *this, me - below, n - (int)ex.size(), timeout, "shrink",
      [ex](uvccl_pg_t* from, uvccl_pg_t* to, uvccl_work_t* w,
           uvccl_work_cb cb) {
        return uvccl_pg_shrink_excluding(from, to, ex.data(), (int)ex.size(),
                                         w, cb);
      });
}
#endif

}  // namespace uvccl_torch
