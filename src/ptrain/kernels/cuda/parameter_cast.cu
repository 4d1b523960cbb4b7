// Element-for-element casts of many tensors in one launch: what autocast does to a layer group's float weights
// each forward, and the backward to their gradients, one kernel a tensor (kernels/parameter_cast.h). Built
// without fast math, as the FP8 casts are: a flushed subnormal would make the result differ from LibTorch's cast.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "ptrain/kernels/cuda/elements.cuh"

namespace ptrain::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // elements a thread, all loads issued before the first store
constexpr int64_t kElementsPerBlock = static_cast<int64_t>(kThreads) * kUnroll;

// One launch's ranges, passed by value (a kernel parameter): nothing to copy to the device first, so a CUDA graph
// captures the launch as it is.
struct CastBatch {
  const void* src[kMaxCastRanges];
  void* dst[kMaxCastRanges];
  int64_t numel[kMaxCastRanges];
  int64_t first_block[kMaxCastRanges + 1];  // range r takes blocks first_block[r] .. first_block[r + 1] - 1
  int count;
};

template <typename In, typename Out>
__global__ void __launch_bounds__(kThreads) cast_ranges_kernel(CastBatch batch) {
  const int64_t block = blockIdx.x;
  int r = 0;
  while (r + 1 < batch.count && batch.first_block[r + 1] <= block) ++r;
  const In* __restrict__ src = static_cast<const In*>(batch.src[r]);
  Out* __restrict__ dst = static_cast<Out*>(batch.dst[r]);
  const int64_t numel = batch.numel[r];
  const int64_t base = (block - batch.first_block[r]) * kElementsPerBlock + threadIdx.x;
  In in[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t i = base + static_cast<int64_t>(u) * kThreads;
    if (i < numel) in[u] = src[i];
  }
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t i = base + static_cast<int64_t>(u) * kThreads;
    if (i < numel) dst[i] = from_float<Out>(to_float(in[u]));
  }
}

}  // namespace

void cast_ranges(Dtype in, Dtype out, const CastRange* ranges, int count, cudaStream_t stream) {
  int next = 0;  // the first range no launch has taken yet
  while (next < count) {
    CastBatch batch = {};
    int64_t blocks = 0;
    for (; next < count && batch.count < kMaxCastRanges; ++next) {
      const int r = next;
      if (ranges[r].numel < 0) throw std::runtime_error("cast_ranges: a range of negative length");
      if (ranges[r].numel == 0) continue;
      const int k = batch.count++;
      batch.src[k] = ranges[r].src;
      batch.dst[k] = ranges[r].dst;
      batch.numel[k] = ranges[r].numel;
      batch.first_block[k] = blocks;
      blocks += (ranges[r].numel + kElementsPerBlock - 1) / kElementsPerBlock;
    }
    batch.first_block[batch.count] = blocks;
    if (batch.count == 0) continue;
    if (blocks > 0x7fffffff) throw std::runtime_error("cast_ranges: " + std::to_string(blocks) + " blocks in one launch");
    with_type(in, [&](auto* in_tag) {
      using In = std::remove_pointer_t<decltype(in_tag)>;
      with_type(out, [&](auto* out_tag) {
        using Out = std::remove_pointer_t<decltype(out_tag)>;
        cast_ranges_kernel<In, Out><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(batch);
      });
    });
    check_launch("cast_ranges");
  }
}

}  // namespace ptrain::kernels::cuda
