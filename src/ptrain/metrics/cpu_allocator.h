// Bytes held by LibTorch's CPU tensors, counted at the allocator, so that a CPU run reports an
// allocator-level peak as a CUDA run reads one from the caching allocator. Host RSS cannot stand in for it:
// it counts the loaded data set, freed pages the C library keeps, and the binary itself.
#pragma once

#include <cstdint>

namespace ptrain::metrics {

// Puts a counting allocator in front of LibTorch's CPU allocator. Tensors allocated before stay
// uncounted (their frees are not subtracted either). Idempotent and thread-safe.
void install_cpu_allocation_counter();

// Bytes the counted CPU tensors hold now, and the highest value since the last reset (or the install).
int64_t cpu_allocated_bytes();
int64_t cpu_peak_allocated_bytes();
void reset_cpu_allocator_peak();  // peak := what is held now

}  // namespace ptrain::metrics
