// Every difference between the LibTorch releases ptrain builds against (Debian's 1.13 on the CPU, the
// 2.x inside the PyTorch wheel on GPU machines) lives here and nowhere else.
#pragma once

#include <ATen/autocast_mode.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace at::cuda {
struct CUDAGraph;
}

#define PTRAIN_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace ptrain::compat {

// Autocast state per device type. 2.4 replaced the per-backend functions by ones taking a DeviceType.
inline bool autocast_enabled(c10::DeviceType device) {
#if PTRAIN_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(device);
#else
  return device == c10::DeviceType::CUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
#endif
}

inline void set_autocast_enabled(c10::DeviceType device, bool enabled) {
#if PTRAIN_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(device, enabled);
#else
  if (device == c10::DeviceType::CUDA) {
    at::autocast::set_enabled(enabled);
  } else {
    at::autocast::set_cpu_enabled(enabled);
  }
#endif
}

inline c10::ScalarType autocast_dtype(c10::DeviceType device) {
#if PTRAIN_TORCH_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(device);
#else
  return device == c10::DeviceType::CUDA ? at::autocast::get_autocast_gpu_dtype()
                                         : at::autocast::get_autocast_cpu_dtype();
#endif
}

inline void set_autocast_dtype(c10::DeviceType device, c10::ScalarType dtype) {
#if PTRAIN_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_dtype(device, dtype);
#else
  if (device == c10::DeviceType::CUDA) {
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
#endif
}

// Whether the CPU autocast of this release casts to float16 (1.13 knows only bfloat16 there).
constexpr bool cpu_autocast_supports_fp16() { return PTRAIN_TORCH_AT_LEAST(2, 3); }

// TensorFloat-32 in cuBLAS and cuDNN matrix work.
inline void set_allow_tf32(bool allow) {
  at::globalContext().setAllowTF32CuBLAS(allow);
  at::globalContext().setAllowTF32CuDNN(allow);
}

inline std::string torch_version() { return TORCH_VERSION; }

// The autocast weight-cast cache (same API in 1.13 and 2.x, here so that all autocast state is set in one
// place). Activation checkpointing turns it off while it recomputes, and clears it when it leaves an
// autocast state it entered itself.
inline bool autocast_cache_enabled() { return at::autocast::is_autocast_cache_enabled(); }
inline void set_autocast_cache_enabled(bool enabled) { at::autocast::set_autocast_cache_enabled(enabled); }
inline void clear_autocast_cache() { at::autocast::clear_cache(); }

// c10::Allocator: 2.3 dropped the const of allocate() and made copy_data() a pure virtual. An allocator
// derives from CpuAllocatorBase and declares `c10::DataPtr allocate(size_t) PTRAIN_ALLOCATE_CONST override`.
#if PTRAIN_TORCH_AT_LEAST(2, 3)
#define PTRAIN_ALLOCATE_CONST
struct CpuAllocatorBase : c10::Allocator {
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};
#else
#define PTRAIN_ALLOCATE_CONST const
using CpuAllocatorBase = c10::Allocator;
#endif

// Peaks of the CUDA caching allocator over all pools, and their reset. 2.6 moved DeviceStats and StatType
// out of c10::cuda::CUDACachingAllocator into c10/core/CachingDeviceAllocator.h (namespace
// c10::CachingAllocator), and getDeviceStats now takes a c10::DeviceIndex. Defined in torch_compat_cuda.cpp;
// CPU builds (torch_compat_none.cpp) throw ptrain::Error.
struct CudaAllocatorPeaks {
  int64_t allocated_bytes;
  int64_t reserved_bytes;
};
CudaAllocatorPeaks cuda_allocator_peaks(int device);
void reset_cuda_allocator_peaks(int device);

// NCCL's broadcast (buffers[0]'s values into the others) and reduce (their sum into buffers[0]) across the CUDA
// devices of one process, from torch/csrc/cuda/nccl.h, which a LibTorch built without NCCL lacks. Both return
// false, having done nothing, where this build has no such NCCL (CPU builds: torch_compat_none.cpp): the
// caller copies instead.
bool nccl_broadcast_from_first(std::vector<torch::Tensor>& buffers);
bool nccl_reduce_into_first(std::vector<torch::Tensor>& buffers);

// Begins graph's capture on the current stream, into a memory pool of its own, in thread-local capture mode
// (the data loader's thread goes on copying batches meanwhile, which global mode refuses). The mode is an
// argument of CUDAGraph::capture_begin in 2.1 and later; 1.13's captures in global mode only, so there this
// throws. Defined in torch_compat_cuda.cpp; CUDA builds alone capture.
void begin_thread_local_capture(at::cuda::CUDAGraph& graph);

// The autocast nesting depth (same API in 1.13 and 2.x). Casted copies of weights are cached for the
// outermost region only (as torch.autocast.__exit__): leaving it clears the cache.
inline void enter_autocast_region() { at::autocast::increment_nesting(); }
inline void leave_autocast_region() {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
}

// Whether the fused GradScaler kernels (_amp_foreach_non_finite_check_and_unscale_, _amp_update_scale_)
// serve tensors of dtype on device. Their CUDA kernels dispatch on float, half and double, not bfloat16, in
// 1.13 and 2.11. 1.13 has no CPU kernels for them (2.11 has); ptrain takes its tensor-op path on the CPU
// in every release, so that CPU runs give the same numbers whichever LibTorch they were built against.
inline bool fused_unscale_supports(const torch::Device& device, c10::ScalarType dtype) {
  return device.is_cuda() && (dtype == torch::kFloat || dtype == torch::kHalf || dtype == torch::kDouble);
}
inline bool fused_scale_update_supports(const torch::Device& device) { return device.is_cuda(); }

// A Conv2d's zero padding as numbers; nullopt for "valid"/"same" or another padding mode. The options hold
// c10::variants in 1.13 and std::variants in 2.x.
inline std::optional<std::vector<int64_t>> explicit_zero_padding(const torch::nn::detail::ConvNdOptions<2>& options) {
#if PTRAIN_TORCH_AT_LEAST(2, 1)
  const auto* numbers = std::get_if<torch::ExpandingArray<2>>(&options.padding());
  const bool zeros = std::holds_alternative<torch::enumtype::kZeros>(options.padding_mode());
#else
  const auto* numbers = c10::get_if<torch::ExpandingArray<2>>(&options.padding());
  const bool zeros = c10::holds_alternative<torch::enumtype::kZeros>(options.padding_mode());
#endif
  if (numbers == nullptr || !zeros) return std::nullopt;
  return std::vector<int64_t>((*numbers)->begin(), (*numbers)->end());
}

}  // namespace ptrain::compat

namespace ptrain::compat {

// Chrome traces from LibTorch's profiler (core/torch_compat.cpp). CUDA builds link PyTorch's wheel, whose
// LibTorch has Kineto: CPU operators and CUDA kernels on one timeline. Debian's CPU LibTorch 1.13 has no
// Kineto (its Kineto API records but cannot save), so CPU builds trace the CPU operators with the legacy
// profiler. One trace at a time; stop_profiler_trace writes path whole (a temporary file renamed over it)
// and throws ptrain::Error naming it if it cannot.
void start_profiler_trace(bool with_cuda, const std::string& path);
void stop_profiler_trace();

// Fused multi-tensor SGD and AdamW steps (at::_fused_sgd_, at::_fused_adamw_) with the learning rate in a
// device tensor, so that a step captured in a CUDA graph reads the rate each replay. 2.4 and later have both
// on CUDA; older releases have neither, and the optimizers use their foreach path. found_inf (0/1 float on
// the device, or undefined) makes the kernels leave everything as it was, as a skipped step must.
constexpr bool has_fused_optimizers() { return PTRAIN_TORCH_AT_LEAST(2, 4); }

inline void fused_sgd_step(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads,
                           const std::vector<torch::Tensor>& momentum_buffers, double weight_decay, double momentum,
                           const torch::Tensor& lr, bool nesterov, const torch::Tensor& found_inf) {
#if PTRAIN_TORCH_AT_LEAST(2, 4)
  const std::optional<torch::Tensor> inf = found_inf.defined() ? std::optional<torch::Tensor>(found_inf) : std::nullopt;
  at::_fused_sgd_(params, grads, momentum_buffers, weight_decay, momentum, lr, /*dampening=*/0.0, nesterov,
                  /*maximize=*/false, /*is_first_step=*/false, /*grad_scale=*/std::nullopt, inf);
#else
  (void)params, (void)grads, (void)momentum_buffers, (void)weight_decay, (void)momentum, (void)lr, (void)nesterov,
      (void)found_inf;
  TORCH_CHECK(false, "fused SGD needs LibTorch 2.4 or later");
#endif
}

inline void fused_adamw_step(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads,
                             const std::vector<torch::Tensor>& exp_avgs, const std::vector<torch::Tensor>& exp_avg_sqs,
                             const std::vector<torch::Tensor>& steps, const torch::Tensor& lr, double beta1,
                             double beta2, double weight_decay, double eps, const torch::Tensor& found_inf) {
#if PTRAIN_TORCH_AT_LEAST(2, 4)
  const std::optional<torch::Tensor> inf = found_inf.defined() ? std::optional<torch::Tensor>(found_inf) : std::nullopt;
  at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, lr, beta1, beta2, weight_decay,
                    eps, /*amsgrad=*/false, /*maximize=*/false, /*grad_scale=*/std::nullopt, inf);
#else
  (void)params, (void)grads, (void)exp_avgs, (void)exp_avg_sqs, (void)steps, (void)lr, (void)beta1, (void)beta2,
      (void)weight_decay, (void)eps, (void)found_inf;
  TORCH_CHECK(false, "fused AdamW needs LibTorch 2.4 or later");
#endif
}

// Causal attention of q, k, v [batch, heads, time, head_dim]: softmax(q k^T / sqrt(head_dim)) v with each
// position blind to later ones. 2.1 and later call scaled_dot_product_attention, whose CUDA kernels (flash,
// memory-efficient) never hold the time x time scores; 1.13 has none, and computes it explicitly.
inline torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
#if PTRAIN_TORCH_AT_LEAST(2, 1)
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
#else
  const int64_t time = q.size(-2);
  auto scores = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  const auto future = torch::ones({time, time}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<double>::infinity());
  return torch::matmul(torch::softmax(scores, -1), v);
#endif
}

// FP8 tensors (E4M3 for activations and weights, E5M2 for gradients) and cuBLASLt's FP8 matrix products. 2.5
// and later have both (Float8 dtypes since 2.1; at::_scaled_mm's 2.4 signature, one output, scales required);
// 1.13 has neither, and every call below fails there: --precision fp8 is refused before (precision/policy.h).
constexpr bool has_fp8_matmul() { return PTRAIN_TORCH_AT_LEAST(2, 5); }

// The largest finite value of the FP8 format (E4M3 448, E5M2 57344), what an amax is scaled to.
constexpr double float8_max(bool e5m2) { return e5m2 ? 57344.0 : 448.0; }

// The FP8 dtype: Float8_e5m2 for e5m2, else Float8_e4m3fn.
inline c10::ScalarType float8_dtype(bool e5m2) {
#if PTRAIN_TORCH_AT_LEAST(2, 5)
  return e5m2 ? c10::ScalarType::Float8_e5m2 : c10::ScalarType::Float8_e4m3fn;
#else
  (void)e5m2;
  TORCH_CHECK(false, "FP8 tensors need LibTorch 2.5 or later, this is " TORCH_VERSION);
#endif
}

// (a * inv_scale_a) @ (b * inv_scale_b) in out_dtype on cuBLASLt's FP8 GEMM: a [M, K] row-major, b [K, N]
// column-major (the transpose of a contiguous [N, K]), K and N multiples of 16, FP8 both (not E5M2 twice);
// the scales fp32 one-element tensors on the device (the inverses of the factors that cast each to FP8).
// fast_accum: Hopper's faster, less exact accumulation (torchao uses it for the forward only).
// bias (undefined for none): [N] in out_dtype (bf16 or fp16), added in the GEMM's epilogue.
inline torch::Tensor scaled_mm(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& inv_scale_a,
                               const torch::Tensor& inv_scale_b, const torch::Tensor& bias, c10::ScalarType out_dtype,
                               bool fast_accum) {
#if PTRAIN_TORCH_AT_LEAST(2, 5)
  const std::optional<at::Tensor> epilogue_bias = bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt;
  return at::_scaled_mm(a, b, inv_scale_a, inv_scale_b, epilogue_bias, /*scale_result=*/std::nullopt, out_dtype,
                        fast_accum);
#else
  (void)a, (void)b, (void)inv_scale_a, (void)inv_scale_b, (void)bias, (void)out_dtype, (void)fast_accum;
  TORCH_CHECK(false, "FP8 matrix products (at::_scaled_mm) need LibTorch 2.5 or later, this is " TORCH_VERSION);
#endif
}

}  // namespace ptrain::compat

// c10d's concrete process groups (ProcessGroupGloo, ProcessGroupNCCL) derive from c10d::Backend since
// 2.0 and from c10d::ProcessGroup before; the collective calls ptrain makes are identical on both.
// Forward declarations keep the c10d headers out of every translation unit that includes this one.
namespace c10d {
class Backend;
class ProcessGroup;
class Store;
}  // namespace c10d

namespace ptrain::compat {
#if PTRAIN_TORCH_AT_LEAST(2, 0)
using C10dBackend = c10d::Backend;
#else
using C10dBackend = c10d::ProcessGroup;
#endif

// gloo process groups (core/torch_compat.cpp). PyTorch's wheels ship LibTorch without gloo's headers, so a
// build against one has NCCL only: has_gloo() is false there, and the two makers throw ptrain::Error.
bool has_gloo();
// A gloo group of world_size ranks rendezvousing through store. It talks on GLOO_SOCKET_IFNAME's interface
// when that is set, over loopback when master_addr is a loopback address, else on the host name's address.
c10::intrusive_ptr<C10dBackend> make_gloo_group(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                int world_size, std::chrono::milliseconds timeout,
                                                const std::string& master_addr);
// A gloo group of some of parent's ranks (parent a gloo group), on parent's network devices.
c10::intrusive_ptr<C10dBackend> make_gloo_subgroup(C10dBackend& parent, const c10::intrusive_ptr<c10d::Store>& store,
                                                   int rank, int world_size, std::chrono::milliseconds timeout);
}  // namespace ptrain::compat
