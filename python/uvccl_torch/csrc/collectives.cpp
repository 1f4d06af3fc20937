// c10d's collectives and point-to-point calls on uvccl: each checks its
// tensors and options, then hands submit() the steps that run it.
#include "process_group.h"

namespace uvccl_torch {

c10::intrusive_ptr<c10d::Work> ProcessGroupUVCCL::broadcast(
    std::vector<at::Tensor>& tensors,
    const c10d::BroadcastOptions& opts) {
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

c10::intrusive_ptr<c10d::Work> ProcessGroupUVCCL::allreduce(
    std::vector<at::Tensor>& tensors,
    const c10d::AllreduceOptions& opts) {
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

c10::intrusive_ptr<c10d::Work> ProcessGroupUVCCL::reduce(
    std::vector<at::Tensor>& tensors,
    const c10d::ReduceOptions& opts) {
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

c10::intrusive_ptr<c10d::Work> ProcessGroupUVCCL::allgather(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
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

c10::intrusive_ptr<c10d::Work> ProcessGroupUVCCL::_allgather_base(
    at::Tensor& output, at::Tensor& input,
    const c10d::AllgatherOptions& opts) {
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

c10::intrusive_ptr<c10d::Work> ProcessGroupUVCCL::barrier(
    const c10d::BarrierOptions& opts) {
  auto work = make_work(c10d::OpType::BARRIER, {}, {}, {});
  return submit(work, Target{&pg_}, [this](uvccl_work_t* w) {
    return uvccl_barrier(&pg_, w, on_done);
  }, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupUVCCL::send(
    std::vector<at::Tensor>& tensors, int dst, int tag) {
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

c10::intrusive_ptr<c10d::Work> ProcessGroupUVCCL::recv(
    std::vector<at::Tensor>& tensors, int src, int tag) {
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

c10::intrusive_ptr<c10d::Work> ProcessGroupUVCCL::recvAnysource(
    std::vector<at::Tensor>& tensors, int tag) {
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

c10::intrusive_ptr<c10d::Work> ProcessGroupUVCCL::allreduce_coalesced(
    std::vector<at::Tensor>& tensors,
    const c10d::AllreduceCoalescedOptions& opts) {
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

c10::intrusive_ptr<c10d::Work> ProcessGroupUVCCL::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& output_lists,
    std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
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

#ifdef UVCCL_TORCH2

c10::intrusive_ptr<c10d::Work> ProcessGroupUVCCL::allreduce_sparse(
    std::vector<at::Tensor>& tensors,
    const c10d::AllreduceOptions& opts) {
  TORCH_CHECK(tensors.size() == 1 && tensors[0].is_sparse(),
              "uvccl: allreduce_sparse takes one sparse tensor");
  return sparse_sum(tensors[0], opts);
}

#endif

c10::intrusive_ptr<c10d::Work> ProcessGroupUVCCL::sparse_sum(
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

c10::intrusive_ptr<c10d::Work> ProcessGroupUVCCL::gather(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
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

c10::intrusive_ptr<c10d::Work> ProcessGroupUVCCL::scatter(
    std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
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

c10::intrusive_ptr<c10d::Work> ProcessGroupUVCCL::reduce_scatter(
    std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
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

c10::intrusive_ptr<c10d::Work> ProcessGroupUVCCL::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input,
    const c10d::ReduceScatterOptions& opts) {
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

#if UVCCL_TORCH_AT_LEAST(2, 1)
c10::intrusive_ptr<c10d::Work> ProcessGroupUVCCL::coalesced_pairs(
    const char* name, std::vector<at::Tensor>& outputs,
    std::vector<at::Tensor>& inputs, int64_t out_per_in, int64_t in_per_out,
    bool nccl_ok, std::chrono::milliseconds timeout,
    const std::function<Step(uvccl_pg_t*, at::Tensor, at::Tensor)>& step) {
  TORCH_CHECK(!inputs.empty() && outputs.size() == inputs.size(), "uvccl: ",
              name, ": one output for each input (", outputs.size(), " and ",
              inputs.size(), ")");
  std::vector<at::Tensor> all = outputs;
  all.insert(all.end(), inputs.begin(), inputs.end());
  for (auto& t : all) check_tensor(t, name);
  for (size_t i = 0; i < inputs.size(); i++)
    TORCH_CHECK(outputs[i].numel() * in_per_out ==
                        inputs[i].numel() * out_per_in &&
                    outputs[i].scalar_type() == inputs[i].scalar_type(),
                "uvccl: ", name, ": output ", i, " has ", outputs[i].numel(),
                " elements of ", outputs[i].scalar_type(), " for input ", i,
                "'s ", inputs[i].numel(), " of ", inputs[i].scalar_type());
  Target tg = target(all, name, nccl_ok);
  auto work = make_work(c10d::OpType::COALESCED, inputs, outputs, {});
  std::vector<std::function<void()>> backs;
  for (size_t i = 0; i < inputs.size(); i++) {
    auto src = inputs[i].contiguous();
    auto dst = outputs[i].contiguous();
    work->keep.push_back(src);
    work->keep.push_back(dst);
    work->steps.push_back(step(tg.pg, src, dst));
    if (!dst.is_same(outputs[i]))
      backs.push_back([u = outputs[i], dst]() mutable { u.copy_(dst); });
  }
  if (!backs.empty())
    work->after = [backs]() {
      for (auto& b : backs) b();
    };
  return submit(work, tg, nullptr, timeout);
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupUVCCL::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return coalesced_pairs(
      "allgather_into_tensor_coalesced", outputs, inputs, getSize(), 1, true,
      opts.timeout, [](uvccl_pg_t* g, at::Tensor src, at::Tensor dst) -> Step {
        return [g, src, dst](uvccl_work_t* w) {
          return uvccl_allgather(g, w, src.data_ptr(), dst.data_ptr(),
                                 (size_t)src.numel(), dtype_of(src), on_done);
        };
      });
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupUVCCL::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  Redop op = redop_of(opts.reduceOp);
  return coalesced_pairs(
      "reduce_scatter_tensor_coalesced", outputs, inputs, 1, getSize(),
      nccl_can(op),
      opts.timeout,
      [this, op](uvccl_pg_t* g, at::Tensor src, at::Tensor dst) -> Step {
        return [this, g, src, dst, op](uvccl_work_t* w) {
          return uvccl_reduce_scatter(g, w, src.data_ptr(), dst.data_ptr(),
                                      (size_t)dst.numel(), dtype_of(dst),
                                      redop(g, op), on_done);
        };
      });
}
#endif

c10::intrusive_ptr<c10d::Work> ProcessGroupUVCCL::alltoall_base(
    at::Tensor& output, at::Tensor& input,
    std::vector<int64_t>& outSplits, std::vector<int64_t>& inSplits,
    const c10d::AllToAllOptions& opts) {
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

c10::intrusive_ptr<c10d::Work> ProcessGroupUVCCL::alltoall(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllToAllOptions& opts) {
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

void ProcessGroupUVCCL::startCoalescing() {
  TORCH_CHECK(!coalescing_, "uvccl: a coalescing block is already open");
  coalescing_ = true;
  coalesced_.clear();
  batch_.clear();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupUVCCL::endCoalescing() {
  TORCH_CHECK(coalescing_, "uvccl: endCoalescing without startCoalescing");
  coalescing_ = false;
  auto works = std::move(coalesced_);
  coalesced_.clear();
  if (!batch_.empty()) works.push_back(submit_batch());
  return MultiWork::make(std::move(works));
}

#endif

void ProcessGroupUVCCL::monitoredBarrier(const c10d::BarrierOptions& opts,
                      bool waitAllRanks) {
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

}  // namespace uvccl_torch
