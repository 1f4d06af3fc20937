// c10d's reconfigure API (PyTorch 2.14: supports_reconfigure,
// get_reconfigure_handle, reconfigure(ReconfigureOptions)) on the uvccl
// backend: the group becomes the world of the peers whose handles are
// given, one handle per peer, made anew over the c10d store the group was
// created with. A handle says which configuration the peer is in and who
// it is: "uvccl:<uuid>:<rank at creation>:<host>:<pid>.<n>" (the uuid is
// -1 until a first reconfigure): unique per process and group, stable
// until the next reconfigure.
#include "process_group.h"

#ifdef C10D_BACKEND_HAS_RECONFIGURE

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <unordered_set>
#include <variant>

namespace uvccl_torch {

namespace {

// The handles in rank order: a list as given, a set sorted (every peer
// sorts the same strings alike). Each checked, none twice.
std::vector<std::string> ordered(const c10d::ReconfigureOptions& opts) {
  std::vector<std::string> hs;
  std::visit([&hs](const auto& in) { hs.assign(in.begin(), in.end()); },
             opts.handles);
  if (std::holds_alternative<std::unordered_set<std::string>>(opts.handles))
    std::sort(hs.begin(), hs.end());
  TORCH_CHECK(!hs.empty(), "uvccl: reconfigure: no handles");
  std::unordered_set<std::string> seen;
  for (const auto& h : hs) {
    TORCH_CHECK(h.compare(0, 6, "uvccl:") == 0 &&
                    std::count(h.begin(), h.end(), ':') == 4,
                "uvccl: reconfigure: '", h, "' is not a uvccl handle "
                "(get_reconfigure_handle of a uvccl group)");
    TORCH_CHECK(seen.insert(h).second, "uvccl: reconfigure: the handle '", h,
                "' is given twice");
  }
  return hs;
}

c10::intrusive_ptr<c10d::Work> completed() {
  auto f = c10::make_intrusive<c10::ivalue::Future>(
      c10::ListType::create(c10::TensorType::get()));
  f->markCompleted(c10::IValue(std::vector<at::Tensor>()));
  return c10d::Work::create_from_future(f);
}

}  // namespace

c10d::ReconfigureHandle ProcessGroupUVCCL::get_reconfigure_handle() const {
  return "uvccl:" + std::to_string(reconf_uuid_) + ":" + ident_;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupUVCCL::reconfigure(
    const c10d::ReconfigureOptions& opts) {
  TORCH_CHECK(c10d_store_.defined(), "uvccl: reconfigure: a group made by "
              "split or shrink has no store to meet its peers through: "
              "reconfigure its world");
  TORCH_CHECK(!shut_, "uvccl: reconfigure: the group is shut down");
  TORCH_CHECK(opts.uuid != reconf_uuid_, "uvccl: reconfigure: uuid ",
              opts.uuid, " is this group's present configuration's: each "
              "reconfigure needs a fresh one");
  auto hs = ordered(opts);
  auto mine = get_reconfigure_handle();
  auto at = std::find(hs.begin(), hs.end(), mine);
  TORCH_CHECK(at != hs.end(), "uvccl: reconfigure: this rank's handle (",
              mine, ") is not among the ", hs.size(), " given");
  int rank = (int)(at - hs.begin()), size = (int)hs.size();
  auto store = c10::make_intrusive<c10d::PrefixStore>(
      "uvccl/reconfigure/" + std::to_string(opts.uuid), c10d_store_);
  // The uuid names the meeting's keys: a reused one would meet stale
  // state. The new rank 0 claims it; a claim that is not its own says
  // another configuration had it.
  if (rank == 0) {
    std::vector<uint8_t> me(mine.begin(), mine.end());
    auto got = store->compareSet("claimed", {}, me);
    TORCH_CHECK(got == me, "uvccl: reconfigure: uuid ", opts.uuid,
                " was used already; each reconfigure needs a fresh one");
  }
  // The loop may need the GIL meanwhile (a future's Python callback):
  // the waits below must not hold it.
  std::unique_ptr<py::gil_scoped_release> nogil;
  if (Py_IsInitialized() && PyGILState_Check())
    nogil = std::make_unique<py::gil_scoped_release>();
  uint64_t saved = timeout_ms_;
  if (opts.timeout.has_value() && opts.timeout->count() > 0)
    timeout_ms_ = (uint64_t)opts.timeout->count();
  teardown();  // the old world: its peers are leaving it too
  rank_ = rank;
  size_ = size;
  try {
    connect(store, rank, size);
  } catch (...) {
    timeout_ms_ = saved;
    throw;
  }
  if (timeout_ms_ != saved) {
    timeout_ms_ = saved;
    loop_->call<int>([this]() {
      uvccl_pg_set_timeout(&pg_, timeout_ms_);
      uvccl_pg_set_timeout(&mb_pg_, timeout_ms_);
      if (npg_.impl_ != nullptr) uvccl_pg_set_timeout(&npg_, timeout_ms_);
      return 0;
    });
  }
  reconf_uuid_ = opts.uuid;
  return completed();
}

}  // namespace uvccl_torch

#endif
