// CUDA builds: NCCL process groups on c10d's ProcessGroupNCCL.
#include <cstdlib>

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "ptrain/distributed/nccl_group.h"

namespace ptrain::distributed {

bool nccl_group_available() { return true; }

c10::intrusive_ptr<compat::C10dBackend> make_nccl_group(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                        int world_size, std::chrono::milliseconds timeout) {
  // NCCL enforces its timeout in a watchdog thread, which aborts the communicator (and, in 2.x by
  // default, the process) instead of letting a collective hang.
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
#ifdef NCCL_HAS_CONFIG
  // A group of one rank has no peer to send to: NCCL runs its collectives as copies on the stream, and no
  // channel carries anything. Each channel still holds device memory (three small buffers, each rounded up to
  // cuMem's 2 MiB): NCCL's 64 channels took 0.55 GiB of one H200 where one takes 0.18
  // (scripts/nccl_memory_probe.py). So one channel, unless the environment sizes them itself.
  if (world_size == 1 && std::getenv("NCCL_MAX_CTAS") == nullptr && std::getenv("NCCL_MAX_NCHANNELS") == nullptr) {
    options->config.minCTAs = 1;
    options->config.maxCTAs = 1;
  }
#endif
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, options);
}

}  // namespace ptrain::distributed
