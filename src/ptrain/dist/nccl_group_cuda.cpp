// CUDA builds: NCCL process groups on c10d's ProcessGroupNCCL.
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "ptrain/dist/nccl_group.h"

namespace ptrain::dist {

bool nccl_group_available() { return true; }

c10::intrusive_ptr<compat::C10dBackend> make_nccl_group(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                        int world_size, std::chrono::milliseconds timeout) {
  // NCCL enforces its timeout in a watchdog thread, which aborts the communicator (and, in 2.x by
  // default, the process) instead of letting a collective hang.
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, options);
}

}  // namespace ptrain::dist
