// CPU builds: no NCCL.
#include "ptrain/core/error.h"
#include "ptrain/distributed/nccl_group.h"

namespace ptrain::distributed {

bool nccl_group_available() { return false; }

c10::intrusive_ptr<compat::C10dBackend> make_nccl_group(const c10::intrusive_ptr<c10d::Store>&, int, int,
                                                        std::chrono::milliseconds) {
  throw Error("--backend nccl needs a CUDA build of LibTorch; this one is CPU-only (use gloo)");
}

}  // namespace ptrain::distributed
