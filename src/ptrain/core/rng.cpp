#include "ptrain/core/rng.h"

namespace ptrain {

namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}
}  // namespace

uint64_t derive_seed(uint64_t seed, std::initializer_list<uint64_t> counters) {
  uint64_t h = splitmix64(seed);
  for (uint64_t c : counters) h = splitmix64(h ^ splitmix64(c));
  return h;
}

}  // namespace ptrain
