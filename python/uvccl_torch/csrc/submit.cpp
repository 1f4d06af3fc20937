// How an operation starts: the group and device it runs on (target), its
// reduce op on that group (redop), its Work (make_work), its steps posted
// to the loop (submit), and batched point-to-point calls (defer_p2p,
// submit_batch).
#include "process_group.h"

namespace uvccl_torch {

uvccl_redop_t ProcessGroupUVCCL::redop(uvccl_pg_t* g, const Redop& r) {
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

c10::intrusive_ptr<c10d::Work> ProcessGroupUVCCL::defer_p2p(
    const c10::intrusive_ptr<WorkUVCCL>& work, const Target& tg,
    bool is_send, const at::Tensor& buf, int peer, int tag) {
  if (!batch_.empty())
    TORCH_CHECK(batch_[0].tg.pg == tg.pg && batch_[0].tg.dev == tg.dev,
                "uvccl: a batch of sends and receives on tensors of two "
                "devices");
  batch_.push_back(Deferred{work, tg, is_send, buf, peer, tag});
  return work;
}

c10::intrusive_ptr<WorkUVCCL> ProcessGroupUVCCL::submit_batch() {
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

bool ProcessGroupUVCCL::nccl_can(const Redop& r) {
  return r.op != UVCCL_BAND && r.op != UVCCL_BOR && r.op != UVCCL_BXOR;
}

ProcessGroupUVCCL::Target ProcessGroupUVCCL::target(
    const std::vector<at::Tensor>& ts, const char* op, bool nccl_ok) {
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

c10::intrusive_ptr<WorkUVCCL> ProcessGroupUVCCL::make_work(
    c10d::OpType type, const std::vector<at::Tensor>& inputs,
    std::vector<at::Tensor> outputs, std::vector<at::Tensor> keep,
    at::Tensor user, at::Tensor buf) {
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

const char* ProcessGroupUVCCL::op_title(c10d::OpType type) {
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

c10::intrusive_ptr<c10d::Work> ProcessGroupUVCCL::submit(
    const c10::intrusive_ptr<WorkUVCCL>& work, const Target& tg, Step first,
    std::chrono::milliseconds timeout) {
  WorkUVCCL* raw = work.get();
  raw->loop = loop_.get();
  raw->group_error = error_;
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
      raw->complete(UVCCL_ECLOSING, "the process group has no world (shut "
                               "down, or made for reconfigure and not yet "
                               "reconfigured)");
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

}  // namespace uvccl_torch
