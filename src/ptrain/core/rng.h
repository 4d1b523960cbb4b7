// Deterministic seeds derived from (seed, stream, counters), so that any step of any epoch can be
// reproduced without replaying the ones before it: what makes a resumed run end where an uninterrupted one does.
#pragma once

#include <cstdint>
#include <initializer_list>

namespace ptrain {

// SplitMix64 finaliser over the mixed inputs: cheap, and well distributed even for consecutive counters.
uint64_t derive_seed(uint64_t seed, std::initializer_list<uint64_t> counters);

}  // namespace ptrain
