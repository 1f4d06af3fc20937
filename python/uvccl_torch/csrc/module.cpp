// The Python module uvccl_torch._C: the backend's class (see
// python/uvccl_torch/__init__.py).
#include "process_group.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "uvccl's c10d backend (see python/uvccl_torch/__init__.py)";
#ifdef UVCCL_TORCH_CUDA
  m.attr("cuda") = true;   // built against a PyTorch with CUDA
#else
  m.attr("cuda") = false;
#endif
  py::class_<uvccl_torch::ProcessGroupUVCCL, uvccl_torch::PGBase,
             c10::intrusive_ptr<uvccl_torch::ProcessGroupUVCCL>>(
      m, "ProcessGroupUVCCL")
      .def(py::init<const c10::intrusive_ptr<c10d::Store>&, int, int,
                    std::chrono::milliseconds, std::string, int, std::string,
                    bool, std::string, bool>(),
           py::arg("store"), py::arg("rank"), py::arg("size"),
           py::arg("timeout"), py::arg("name") = "uvccl",
           py::arg("cuda_device") = -1, py::arg("cuda_id") = "",
           py::arg("nccl") = false, py::arg("host") = "",
           py::arg("deferred") = false,
           py::call_guard<py::gil_scoped_release>())
      .def("cuda_mode", &uvccl_torch::ProcessGroupUVCCL::cuda_mode,
           "How CUDA tensors travel: 'nccl' (a uvccl NCCL group), 'staged' "
           "(through pinned host memory over the TCP group) or 'none'.")
      .def("abort",
           static_cast<void (uvccl_torch::ProcessGroupUVCCL::*)(
               const std::string&)>(&uvccl_torch::ProcessGroupUVCCL::abort),
           py::arg("reason") = "aborted by its application",
           py::call_guard<py::gil_scoped_release>(),
           "Fails every pending operation of the group, here and on every "
           "other rank (with the reason); destroy the group after.");
}
