// uvccl's callbacks that finish a WorkUVCCL (see work.h).
#include "work.h"

namespace uvccl_torch {

void on_done(uvccl_work_t* w, int status) {
  auto* work = static_cast<WorkUVCCL*>(w->data);
  if (status == 0 && work->source_ == -2) work->source_ = (int)w->result;
  if (status != 0) {
    work->complete(status, w->msg);
  } else if (!work->start_next()) {
    work->complete(0, nullptr);
  } else if (!work->isCompleted()) {
    return;  // the next step is under way: the loop keeps its reference
  }
  if (work->loop != nullptr) work->loop->kick();  // the next may come soon
  work->release();
  c10::raw::intrusive_ptr::decref(work);  // the loop's reference
}

#ifdef UVCCL_TORCH_CUDA
// The NCCL stream's dependency on the caller's stream is in place (or
// failed: then the operation fails, unless it already ended).
void on_dep(uvccl_work_t* w, int status) {
  auto* work = static_cast<WorkUVCCL*>(w->data);
  if (status != 0) work->complete(status, w->msg);
  c10::raw::intrusive_ptr::decref(work);  // on_dep's reference
}

// The caller's stream now waits for the operation (wait() may return).
void on_ordered(uvccl_work_t* w, int status) {
  auto* work = static_cast<WorkUVCCL*>(w->data);
  work->set_ordered(status == 0 ? 1 : -1);
  c10::raw::intrusive_ptr::decref(work);  // on_ordered's reference
}
#endif

}  // namespace uvccl_torch
