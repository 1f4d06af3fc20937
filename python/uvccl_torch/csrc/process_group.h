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
#pragma once

#include "c10d.h"
#include "loop.h"
#include "tensors.h"
#include "work.h"

namespace uvccl_torch {

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
  // is there (see "CUDA tensors" below); host: the address rank 0's store
  // server is bound to and told as ("": $MASTER_ADDR, else the host name).
  // deferred: made for c10d's reconfigure regime
  // (init_process_group(enable_reconfigure=True)): no world until
  // reconfigure() makes one.
  ProcessGroupUVCCL(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                    int size, std::chrono::milliseconds timeout,
                    std::string name = "uvccl", int cuda_device = -1,
                    std::string cuda_id = "", bool nccl_ok = false,
                    std::string host = "", bool deferred = false);

  // A group made from parent's connections by split or shrink (no store,
  // no new sockets), with the rank and size the callers computed: make
  // starts the uvccl operation that makes `to` from `from`, run for the TCP
  // group and, where the parent has one, for its NCCL group. Fails (a
  // RuntimeError) when uvccl made another group than expected.
  using MakeFn = std::function<int(uvccl_pg_t* from, uvccl_pg_t* to,
                                   uvccl_work_t* w, uvccl_work_cb cb)>;
  ProcessGroupUVCCL(ProcessGroupUVCCL& parent, int rank, int size,
                    std::chrono::milliseconds timeout, const char* what,
                    const MakeFn& make);

  // "nccl", "staged" or "none": how CUDA tensors travel in this group.
  std::string cuda_mode() const;

  ~ProcessGroupUVCCL() override;

  const std::string getBackendName() const override;

  // Fails every pending operation of the group at once, here and (with
  // the reason) on every other rank; the group is unusable after (destroy
  // it). For an application that must stop a stuck job without waiting
  // for its timeouts.
  // c10d's own abort (a virtual of Backend in newer PyTorch, which
  // _abort_process_group calls; declared without `override` so that it
  // overrides where the base has it and is a plain method where not).
  void abort();

  void abort(const std::string& reason);

  // c10d's per-group sequence number: every collective counts one (point-
  // to-point operations do not: they need not match across ranks). Groups
  // are made by all their ranks at once, so every rank starts at 0.
  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override;

  // Runs one uvccl operation started by start (on the loop) and waits for
  // it; 0 or the code, with its message in *msg.
  int blocking(std::function<int(uvccl_work_t*, uvccl_work_cb)> start,
               std::string* msg);

  // At creation, on every rank alike: how CUDA tensors will travel. The
  // ranks exchange (GPU identity, device, NCCL there) over the TCP group
  // and all reach the same answer from the same facts; where it is NCCL,
  // the NCCL group is made now, by every rank at once (made at a first
  // CUDA operation instead, a point-to-point one would wait for ranks
  // that never join). $UVCCL_TORCH_CUDA: auto (default), nccl (fail
  // where it cannot be), staged.
  void setup_cuda(int dev, const std::string& id, bool nccl_ok);

  // ---- collectives ----

  c10::intrusive_ptr<c10d::Work> broadcast(
      std::vector<at::Tensor>& tensors,
      const c10d::BroadcastOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> reduce(
      std::vector<at::Tensor>& tensors,
      const c10d::ReduceOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::AllgatherOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> barrier(
      const c10d::BarrierOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors,
                                      int dst, int tag) override;

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors,
                                      int src, int tag) override;

  c10::intrusive_ptr<c10d::Work> recvAnysource(
      std::vector<at::Tensor>& tensors, int tag) override;

  // One flat buffer per dtype: one operation each, then the pieces go back.
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts) override;

  // Each rank's inputs as bytes, one allgather, then every rank's pieces
  // into output_lists[rank] (any mix of dtypes and shapes, the same on
  // every rank).
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& output_lists,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;

  // Sparse SUM the way Gloo does it: each rank's coalesced indices and
  // values are allgathered (their counts first), and every rank adds them
  // up into one coalesced tensor, which replaces the input's contents.
#ifdef UVCCL_TORCH2
  // PyTorch 2 sends sparse tensors here
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts) override;
#endif

  c10::intrusive_ptr<c10d::Work> sparse_sum(
      at::Tensor& t, const c10d::AllreduceOptions& opts);

  c10::intrusive_ptr<c10d::Work> gather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::GatherOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ScatterOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> alltoall_base(
      at::Tensor& output, at::Tensor& input,
      std::vector<int64_t>& outSplits, std::vector<int64_t>& inSplits,
      const c10d::AllToAllOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> alltoall(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllToAllOptions& opts) override;

#if UVCCL_TORCH_AT_LEAST(2, 1)
  // One all_gather_into_tensor (reduce_scatter_tensor) per pair of output
  // and input, as one Work: c10d's _coalescing_manager and the functional
  // collectives' *_coalesced (2.14 names them all_gather_single_coalesced
  // and reduce_scatter_single_coalesced, which come here). The pairs run
  // one after another on the loop, in order, the same on every rank.
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;

  // Both: one step per pair (output i holds out_per_in / in_per_out times
  // input i's elements, of its dtype), made by step from the pair's
  // contiguous tensors; a non-contiguous output is copied back after.
  c10::intrusive_ptr<c10d::Work> coalesced_pairs(
      const char* name, std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs, int64_t out_per_in, int64_t in_per_out,
      bool nccl_ok, std::chrono::milliseconds timeout,
      const std::function<Step(uvccl_pg_t*, at::Tensor, at::Tensor)>& step);
#endif

#if UVCCL_TORCH_AT_LEAST(2, 14)
  // The group's state after a failure: TIMEOUT when an operation's
  // timeout expired, COMM_ERROR for any other failure of one (a peer
  // that died, an abort); the exceptions name the rank.
  c10d::ErrorType getError() override;

  // The timeout of the operations started after this call (c10d's
  // per-group timeout; an operation's own option still wins).
  void setTimeout(std::chrono::milliseconds timeout) override;
#endif

#if UVCCL_TORCH_AT_LEAST(2, 14)
  // c10d's split_group (ProcessGroup::splitGroup asks each device's
  // backend): every rank of this group calls it, each with the ranks of
  // its own new group (this group's ranks, in their new order); a rank in
  // none gets nullptr. uvccl_pg_split on these connections: no store, no
  // new sockets.
  bool supportsSplitting() const override { return true; }
  c10::intrusive_ptr<c10d::Backend> split(
      const c10::intrusive_ptr<c10d::Store>& store,
      const std::vector<int>& ranks,
      const c10::intrusive_ptr<Options>& opts) override;

  // c10d's shrink_group: only the ranks staying call it, each with the
  // same list; uvccl_pg_shrink_excluding (nobody waits for the excluded,
  // alive or not). SHRINK_ABORT revokes this group first (its pending
  // operations fail on every rank). A rank that failed meanwhile, not in
  // the list, makes it fail on every caller, naming that rank.
  bool supportsShrinking() const override { return true; }
  c10::intrusive_ptr<c10d::Backend> shrink(
      const std::vector<int64_t>& ranks_to_exclude, int shrink_flags,
      const c10::intrusive_ptr<Options>& opts_override) override;

  // What split_group and shrink_group start from: the backend's name and
  // this group's timeout.
  c10::intrusive_ptr<Options> getBackendOptions() override;
#endif

#ifdef C10D_BACKEND_HAS_RECONFIGURE
  // c10d's reconfigure (fault tolerance: grow, shrink, both, a merge): the
  // application gathers every peer's handle out of band and each calls
  // reconfigure with the same uuid (fresh each time) and handles; this
  // group then becomes the world of those peers, rank = the handle's place
  // in the list (a set: sorted), made anew over the c10d store it was
  // created with under "uvccl/reconfigure/<uuid>/" (its rank 0 serves
  // uvccl's store there), CUDA tensors' NCCL group included. The old world
  // is left first: on failure the group has none until a reconfigure
  // succeeds. Groups made by split or shrink have no store: they cannot.
  bool supportsReconfigure() const override { return c10d_store_.defined(); }
  c10d::ReconfigureHandle get_reconfigure_handle() const override;
  c10::intrusive_ptr<c10d::Work> reconfigure(
      const c10d::ReconfigureOptions& opts) override;
#endif

  // The first failure of an operation of this group (see getError), as a
  // uvccl code; 0: none. Any thread.
  int first_error() const { return error_->load(); }

#ifdef UVCCL_TORCH2
  // c10d's coalescing blocks (batch_isend_irecv on CUDA tensors, the
  // _coalescing_manager): the sends and receives called inside start
  // together as one uvccl_p2p_batch at the end (on NCCL a send and a
  // receive started one after the other could wait for each other); the
  // collectives run as called. endCoalescing's Work covers them all.
  void startCoalescing() override;

  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
#endif

  // c10d's monitored_barrier, with c10d's messages (scripts and PyTorch's
  // tests match them): every rank tells rank 0 it arrived and waits for
  // rank 0's answer; rank 0 waits for each within the timeout and names
  // the first that did not come (all of them with waitAllRanks), uvccl's
  // own account of the failure following. The messages travel on a
  // private subgroup (mb_pg_), so they never meet the application's own
  // sends and receives, whatever their tags.
  void monitoredBarrier(const c10d::BarrierOptions& opts,
                        bool waitAllRanks) override;

 private:
  // On the loop: uvccl's op id; a PREMUL_SUM factor becomes an id of the
  // group g once, then is found again (DDP's 1/world_size on every bucket).
  uvccl_redop_t redop(uvccl_pg_t* g, const Redop& r);

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
      bool is_send, const at::Tensor& buf, int peer, int tag);

  c10::intrusive_ptr<WorkUVCCL> submit_batch();

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

  static bool nccl_can(const Redop& r);

  // Which group runs an operation on these tensors.
  Target target(const std::vector<at::Tensor>& ts, const char* op,
                bool nccl_ok = true);

  static std::string publish_host(const std::string& host);

  int local_ranks(int rank, int size);

  // outputs: what result() and the future give; keep: the buffers the
  // operation uses; (user, buf): copy buf back into user after success
  // when they differ (a non-contiguous output).
  c10::intrusive_ptr<WorkUVCCL> make_work(
      c10d::OpType type, const std::vector<at::Tensor>& inputs,
      std::vector<at::Tensor> outputs, std::vector<at::Tensor> keep,
      at::Tensor user = at::Tensor(), at::Tensor buf = at::Tensor());

  static const char* op_title(c10d::OpType type);

  // Queues the operation's steps (first, then any already on the work)
  // for the loop, on tg's group. timeout: the options' (unset: the
  // group's).
  c10::intrusive_ptr<c10d::Work> submit(
      const c10::intrusive_ptr<WorkUVCCL>& work, const Target& tg, Step first,
      std::chrono::milliseconds timeout = c10d::kUnsetTimeout);

  void shutdown();

  // Makes this rank's world over store (rank 0's uvccl store server, the
  // groups, CUDA tensors' group): the constructor's, and reconfigure's.
  void connect(const c10::intrusive_ptr<c10d::Store>& store, int rank,
               int size);

  // Leaves the world (groups destroyed, store client and server closed)
  // and forgets what belonged to it: shutdown's, and reconfigure's before
  // it connects again.
  void teardown();

  // destroy order: the group, then its store client, then the server
  void part_done();

  std::shared_ptr<Loop> loop_;
  std::string name_;
  std::map<std::pair<uvccl_pg_t*, double>, uvccl_redop_t> premul_;
  std::atomic<uint64_t> seq_{0};
  // the first failure of one of its operations (WorkUVCCL::group_error)
  std::shared_ptr<std::atomic<int>> error_ = std::make_shared<std::atomic<int>>(0);
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
  // creation's arguments, for reconfigure: the c10d store (undefined for
  // groups made by split or shrink), this rank's GPU, the host told
  c10::intrusive_ptr<c10d::Store> c10d_store_;
  int cuda_device_arg_ = -1;
  std::string cuda_id_;
  bool nccl_ok_ = false;
  std::string host_arg_;
  // reconfigure: the configuration's uuid (-1: the creation's), and who
  // this process is in every handle (its rank at creation, host and pid)
  int64_t reconf_uuid_ = -1;
  std::string ident_;
  uvccl_store_t store_;
  uvccl_store_server_t server_;
  std::string host_;
  uint64_t timeout_ms_ = 0;
  bool has_server_ = false, has_store_ = false, pg_up_ = false, shut_ = false;
  // its NCCL group was made over this group's store (shrink needs one)
  bool nccl_has_store_ = false;
  int parts_ = 0;
  std::promise<void>* part_done_ = nullptr;
};

}  // namespace uvccl_torch
