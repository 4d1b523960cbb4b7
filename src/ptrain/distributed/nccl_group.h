// NCCL process groups, chosen at link time: nccl_group_cuda.cpp in CUDA builds, nccl_group_none.cpp in
// CPU builds, so that process_group.cpp never asks which build it is in.
#pragma once

#include <chrono>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "ptrain/core/torch_compat.h"

namespace ptrain::distributed {

// Whether this build can form NCCL groups (CUDA builds).
bool nccl_group_available();

// An NCCL group of world_size ranks rendezvousing through store; NCCL enforces timeout in its watchdog.
// CPU builds: throws ptrain::Error.
c10::intrusive_ptr<compat::C10dBackend> make_nccl_group(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                        int world_size, std::chrono::milliseconds timeout);

}  // namespace ptrain::distributed
