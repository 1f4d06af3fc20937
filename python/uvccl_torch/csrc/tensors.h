// Tensors and c10d's types in uvccl's terms: dtypes, reduce ops, checks,
// byte views, flattening.
#pragma once

#include "c10d.h"

namespace uvccl_torch {

inline uvccl_dtype_t dtype_of(const at::Tensor& t) {
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

// A c10d ReduceOp: uvccl's op, or PREMUL_SUM with its factor (made into a
// group's operation id on the loop: see ProcessGroupUVCCL::redop).
struct Redop {
  uvccl_redop_t op = UVCCL_SUM;
  bool premul = false;
  double factor = 1.0;
};

inline Redop redop_of(const c10d::ReduceOp& rop) {
  Redop r;
  switch (rop.op_) {
    case c10d::ReduceOp::SUM: r.op = UVCCL_SUM; return r;
    case c10d::ReduceOp::AVG: r.op = UVCCL_AVG; return r;
    case c10d::ReduceOp::PRODUCT: r.op = UVCCL_PRODUCT; return r;
    case c10d::ReduceOp::MIN: r.op = UVCCL_MIN; return r;
    case c10d::ReduceOp::MAX: r.op = UVCCL_MAX; return r;
    case c10d::ReduceOp::BAND: r.op = UVCCL_BAND; return r;
    case c10d::ReduceOp::BOR: r.op = UVCCL_BOR; return r;
    case c10d::ReduceOp::BXOR: r.op = UVCCL_BXOR; return r;
    case c10d::ReduceOp::PREMUL_SUM: {
      auto* sup = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(
          rop.supplement_.get());
      TORCH_CHECK(sup != nullptr, "uvccl: PREMUL_SUM without its factor");
      r.op = UVCCL_PREMUL_SUM;
      r.premul = true;
#ifdef UVCCL_TORCH2
      const at::Tensor* f =
          sup->tensor_factor.defined() ? &sup->tensor_factor : nullptr;
#else
      const at::Tensor* f =
          sup->tensor_factors.empty() ? nullptr : &sup->tensor_factors[0];
#endif
      if (f != nullptr) {
        TORCH_CHECK(f->numel() == 1,
                    "uvccl: PREMUL_SUM: the factor tensor must hold one value");
        r.factor = f->item<double>();
      } else {
        r.factor = sup->double_factor;
      }
      return r;
    }
    default: break;
  }
  TORCH_CHECK(false, "uvccl: ReduceOp ", (int)rop.op_, " is not supported");
}

// CPU tensors, and CUDA tensors where the extension was built against a
// PyTorch with CUDA; dense only (sparse tensors: allreduce SUM alone).
inline void check_tensor(const at::Tensor& t, const char* op) {
#ifdef UVCCL_TORCH_CUDA
  TORCH_CHECK(t.device().is_cpu() || t.device().is_cuda(), "uvccl: ", op,
              ": CPU or CUDA tensors only (got ", t.device(), ")");
#else
  TORCH_CHECK(t.device().is_cpu(), "uvccl: ", op,
              ": CPU tensors only in this build (got ", t.device(),
              "; CUDA tensors need the extension built against a PyTorch "
              "with CUDA)");
#endif
  TORCH_CHECK(!t.is_sparse(), "uvccl: ", op, ": sparse tensors are only "
              "supported by allreduce (SUM)");
}

inline at::Tensor& single(std::vector<at::Tensor>& ts, const char* op) {
  TORCH_CHECK(ts.size() == 1, "uvccl: ", op, " takes one tensor per call, ",
              "got ", ts.size());
  check_tensor(ts[0], op);
  return ts[0];
}

// A tensor's bytes, as a flat uint8 tensor on its device (a copy where not
// contiguous).
inline at::Tensor bytes_of(const at::Tensor& t) {
  auto c = t.contiguous();
  return at::from_blob(c.data_ptr(), {(int64_t)c.nbytes()},
                       [c](void*) {}, c.options().dtype(at::kByte));
}

// 64-bit FNV-1a: the same on every process (std::hash need not be).
inline uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return h;
}

// flat (one dtype) back into the tensors it was made of, in order.
inline void unflatten(const at::Tensor& flat, std::vector<at::Tensor>& ts) {
  int64_t off = 0;
  for (auto& o : ts) {
    o.copy_(flat.narrow(0, off, o.numel()).view(o.sizes()));
    off += o.numel();
  }
}

// flat bytes back into tensors of any dtypes, in order.
inline void unflatten_bytes(const at::Tensor& flat,
                            std::vector<at::Tensor>& ts) {
  int64_t off = 0;
  for (auto& o : ts) {
    auto n = (int64_t)o.nbytes();
    auto piece = flat.narrow(0, off, n).clone();
    o.copy_(piece.view(o.scalar_type()).view(o.sizes()));
    off += n;
  }
}

static constexpr int kSparseMaxDims = 12;
static constexpr int kSparseMeta = 4 + kSparseMaxDims;

}  // namespace uvccl_torch
