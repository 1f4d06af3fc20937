// What of PyTorch this binding builds on: c10d's Backend (PyTorch 2.x) or
// ProcessGroup (1.13), its store and work, pybind11, and uvccl.
#pragma once

#include <torch/python.h>
#include <torch/version.h>
#if TORCH_VERSION_MAJOR >= 2
// PyTorch 2: a process group holds one Backend per device type; this one
// serves CPU tensors, and CUDA tensors where built for them.
#include <torch/csrc/distributed/c10d/Backend.hpp>
#define UVCCL_TORCH2 1
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <pybind11/chrono.h>
#ifdef UVCCL_TORCH_CUDA
// CUDA tensors: the caller's current stream orders the operations (see
// ProcessGroupUVCCL::target)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <uvccl.h>

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

// The PyTorch this extension is built against is at least MAJOR.MINOR
// (the Backend API grew by release: docs/pytorch.md has which brought what).
#define UVCCL_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||        \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace uvccl_torch {

#ifdef UVCCL_TORCH2
using PGBase = c10d::Backend;
#else
using PGBase = c10d::ProcessGroup;
#endif

}  // namespace uvccl_torch
