// CUDA builds: tensors in, the launchers of cuda/ out, on the current stream.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>
#include <stdexcept>
#include <utility>

#include "ptrain/core/error.h"
#include "ptrain/core/torch_compat.h"
#include "ptrain/kernels/cuda/launch.h"
#include "ptrain/kernels/cudnn/conv_stats_graph.h"
#include "ptrain/kernels/fused.h"

namespace ptrain::kernels::fused {

namespace {

cuda::Dtype dtype_of(const torch::Tensor& t, const char* what) {
  switch (t.scalar_type()) {
    case torch::kFloat: return cuda::Dtype::kFloat;
    case torch::kHalf: return cuda::Dtype::kHalf;
    case torch::kBFloat16: return cuda::Dtype::kBFloat16;
    default: throw Error(std::string(what) + ": no fused kernel for " + c10::toString(t.scalar_type()));
  }
}

cudaStream_t current_stream(const torch::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

void check_rows_and_labels(const torch::Tensor& logits, const torch::Tensor& labels, const char* what) {
  check(logits.is_cuda() && labels.device() == logits.device(),
        std::string(what) + ": logits and labels must be on one CUDA device");
  check(logits.dim() == 2 && logits.stride(1) == 1,
        std::string(what) + ": logits must be [rows, classes] with unit stride along classes, got shape " +
            c10::str(logits.sizes()) + " strides " + c10::str(logits.strides()));
  check(labels.dim() == 1 && labels.size(0) == logits.size(0) && labels.scalar_type() == torch::kInt64,
        std::string(what) + ": labels must be int64 [rows]");
}

template <typename Launch>
void launch(const char* what, Launch&& fn) {
  try {
    fn();
  } catch (const std::runtime_error& e) {
    throw Error(std::string(what) + ": " + e.what());
  }
}

// Channels-last [N, C, H, W] as [rows, channels].
int64_t rows_of(const torch::Tensor& x) { return x.size(0) * x.size(2) * x.size(3); }

const void* data_or_null(const torch::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }
void* mutable_data_or_null(const torch::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }
// An fp8_amax_stats buffer's first float as the bits a kernel raises by atomicMax (cuda/amax.cuh).
unsigned int* amax_bits(const torch::Tensor& stats) { return reinterpret_cast<unsigned int*>(stats.data_ptr<float>()); }

// t, or a copy of it where its data does not start on the 16 bytes the kernels' vector loads need (a view
// into another tensor may not).
torch::Tensor aligned16(const torch::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 ? t : t.clone();
}

cuda::Dtype param_dtype_of(const torch::Tensor& weight, const torch::Tensor& running_mean, const char* what) {
  const torch::Tensor& any = weight.defined() ? weight : running_mean;
  return any.defined() ? dtype_of(any, what) : cuda::Dtype::kFloat;
}

// [N, C, H, W] sizes as the kernels' pooling geometry.
cuda::PoolShape pool_shape(at::IntArrayRef x_sizes, int64_t kernel, int64_t stride, int64_t padding) {
  const auto out = [&](int64_t in) { return (in + 2 * padding - kernel) / stride + 1; };
  return {x_sizes[0], x_sizes[1], x_sizes[2], x_sizes[3], out(x_sizes[2]), out(x_sizes[3]),
          static_cast<int>(kernel), static_cast<int>(stride), static_cast<int>(padding)};
}

cuda::BatchNormPasses kernel_passes(BatchNormPasses passes) {
  switch (passes) {
    case BatchNormPasses::kSplit: return cuda::BatchNormPasses::kSplit;
    case BatchNormPasses::kSinglePass: return cuda::BatchNormPasses::kSinglePass;
    case BatchNormPasses::kAuto: break;
  }
  return cuda::BatchNormPasses::kAuto;
}

// The batch-norm kernels' activations: x channels-last [N, C, H, W] on CUDA, the residual (when defined) like it.
void check_activations(const torch::Tensor& x, const torch::Tensor& residual, const char* what) {
  check(x.is_cuda() && x.dim() == 4 && x.is_contiguous(at::MemoryFormat::ChannelsLast),
        std::string(what) + ": x must be a channels-last [N, C, H, W] CUDA tensor");
  check(!residual.defined() || (residual.sizes() == x.sizes() && residual.scalar_type() == x.scalar_type() &&
                                residual.is_contiguous(at::MemoryFormat::ChannelsLast)),
        std::string(what) + ": the residual must match x (shape, dtype, channels-last)");
}

// The gradients arriving at a batch norm's output, as the kernels read them: in x's dtype and channels-last (one
// arriving from a reshaping layer need not be); dy2, a second use's gradient, undefined when not given.
std::pair<torch::Tensor, torch::Tensor> kernel_gradients(const torch::Tensor& dy, const torch::Tensor& dy2,
                                                         const torch::Tensor& x, const char* what) {
  torch::Tensor second;
  if (dy2.defined()) {
    check(dy2.sizes() == x.sizes(), std::string(what) + ": the second gradient must be shaped as x, got " +
                                        c10::str(dy2.sizes()) + " for " + c10::str(x.sizes()));
    second = dy2.to(x.scalar_type()).contiguous(at::MemoryFormat::ChannelsLast);
  }
  return {dy.to(x.scalar_type()).contiguous(at::MemoryFormat::ChannelsLast), second};
}

cuda::BatchNormSide side_of(const BatchNormParams& bn, const BatchNormStats& stats) {
  cuda::BatchNormSide side;
  side.weight = data_or_null(bn.weight);
  side.bias = data_or_null(bn.bias);
  side.running_mean = mutable_data_or_null(bn.running_mean);
  side.running_var = mutable_data_or_null(bn.running_var);
  side.momentum = bn.momentum;
  side.eps = bn.eps;
  side.mean = stats.mean.data_ptr<float>();
  side.invstd = stats.invstd.data_ptr<float>();
  side.scale_shift = stats.scale_shift.data_ptr<float>();
  return side;
}

// A batch norm as its backward kernels read it: the forward's statistics and the weight (for dx); the other
// parameters are the forward's alone.
cuda::BatchNormSide backward_side(const torch::Tensor& weight, const BatchNormStats& stats) {
  return cuda::BatchNormSide{data_or_null(weight),           nullptr, nullptr, nullptr, 0.0, 0.0,
                             stats.mean.data_ptr<float>(),   stats.invstd.data_ptr<float>(),
                             stats.scale_shift.data_ptr<float>()};
}

}  // namespace

BatchNormReluForward batch_norm_relu_forward(const torch::Tensor& x, const torch::Tensor& residual,
                                             const torch::Tensor& weight, const torch::Tensor& bias,
                                             const torch::Tensor& running_mean, const torch::Tensor& running_var,
                                             double momentum, double eps, bool relu, BatchNormPasses passes) {
  const char* what = "fused batch_norm_relu";
  check_activations(x, residual, what);
  c10::cuda::CUDAGuard guard(x.device());
  const int64_t channels = x.size(1), rows = rows_of(x);
  const auto floats = x.options().dtype(torch::kFloat);
  BatchNormReluForward out{torch::empty_like(x), torch::empty({channels}, floats), torch::empty({channels}, floats),
                           torch::empty({2 * channels}, floats)};
  const auto& scale_shift = out.scale_shift;
  auto workspace = torch::empty({cuda::batch_norm_workspace_floats(rows, channels)}, floats);
  launch(what, [&] {
    const cuda::BatchNormShape shape{dtype_of(x, what), param_dtype_of(weight, running_mean, what), rows, channels};
    const auto side = side_of({weight, bias, running_mean, running_var, momentum, eps},
                              {out.mean, out.invstd, scale_shift});
    out.single_pass = cuda::batch_norm_relu_forward(shape, {x.data_ptr(), data_or_null(residual), relu, out.y.data_ptr()},
                                                    side, workspace.data_ptr<float>(), current_stream(x),
                                                    {kernel_passes(passes)});
  });
  return out;
}

namespace {

BatchNormStats stats_for(int64_t channels, const torch::TensorOptions& floats) {
  return {torch::empty({channels}, floats), torch::empty({channels}, floats), torch::empty({2 * channels}, floats)};
}

// The dual kernels take one parameter dtype for both batch norms, and x2 like x.
bool dual_kernels_take(const torch::Tensor& x, const torch::Tensor& x2, const torch::Tensor& weight,
                       const torch::Tensor& weight2) {
  return x2.sizes() == x.sizes() && x2.scalar_type() == x.scalar_type() && x2.device() == x.device() &&
         x2.is_contiguous(at::MemoryFormat::ChannelsLast) && weight.defined() && weight2.defined() &&
         weight.scalar_type() == weight2.scalar_type();
}

// The kernels take a batch norm's parameters and running statistics as one dtype (P): a weight, and the bias and
// statistics, where given, of its dtype.
bool one_param_dtype(const BatchNormParams& bn) {
  if (!bn.weight.defined()) return false;
  const auto same = [&](const torch::Tensor& t) { return !t.defined() || t.scalar_type() == bn.weight.scalar_type(); };
  return same(bn.bias) && same(bn.running_mean) && same(bn.running_var);
}

bool dual_kernels_take(const torch::Tensor& x, const BatchNormParams& bn, const torch::Tensor& x2,
                       const BatchNormParams& bn2) {
  return dual_kernels_take(x, x2, bn.weight, bn2.weight) && one_param_dtype(bn) && one_param_dtype(bn2);
}

}  // namespace

DualBatchNormReluForward batch_norm_add_batch_norm_relu_forward(const torch::Tensor& x, const BatchNormParams& bn,
                                                                const torch::Tensor& x2, const BatchNormParams& bn2) {
  const char* what = "fused batch_norm_add_batch_norm_relu";
  check_activations(x, torch::Tensor(), what);
  c10::cuda::CUDAGuard guard(x.device());
  const int64_t channels = x.size(1), rows = rows_of(x);
  const auto floats = x.options().dtype(torch::kFloat);
  DualBatchNormReluForward out;
  if (dual_kernels_take(x, bn, x2, bn2)) {
    out.y = torch::empty_like(x);
    out.stats = stats_for(channels, floats);
    out.stats2 = stats_for(channels, floats);
    auto workspace = torch::empty({cuda::dual_batch_norm_workspace_floats(rows, channels)}, floats);
    launch(what, [&] {
      out.single_pass = cuda::batch_norm_add_batch_norm_relu_forward(
          {dtype_of(x, what), param_dtype_of(bn.weight, bn.running_mean, what), rows, channels}, x.data_ptr(),
          x2.data_ptr(), side_of(bn, out.stats), side_of(bn2, out.stats2), out.y.data_ptr(),
          workspace.data_ptr<float>(), current_stream(x));
    });
    if (out.single_pass) return out;
  }
  // The two batch norms apart: the shortcut's (no ReLU), then x's with its output as the residual.
  const auto shortcut = batch_norm_relu_forward(x2, torch::Tensor(), bn2.weight, bn2.bias, bn2.running_mean,
                                                bn2.running_var, bn2.momentum, bn2.eps, /*relu=*/false);
  const auto main = batch_norm_relu_forward(x, shortcut.y, bn.weight, bn.bias, bn.running_mean, bn.running_var,
                                            bn.momentum, bn.eps, /*relu=*/true);
  out.y = main.y;
  out.stats = {main.mean, main.invstd, main.scale_shift};
  out.stats2 = {shortcut.mean, shortcut.invstd, shortcut.scale_shift};
  out.single_pass = false;
  return out;
}

BatchNormStatsFromSums batch_norm_stats_from_sums(const torch::Tensor& sum, const torch::Tensor& sum_of_squares,
                                                  int64_t count, const torch::Tensor& weight, const torch::Tensor& bias,
                                                  const torch::Tensor& running_mean, const torch::Tensor& running_var,
                                                  double momentum, double eps, c10::ScalarType prologue_dtype) {
  const char* what = "fused batch_norm statistics from sums";
  check(sum.is_cuda() && sum.scalar_type() == torch::kFloat && sum.dim() == 1 && sum.is_contiguous() &&
            sum_of_squares.sizes() == sum.sizes() && sum_of_squares.scalar_type() == torch::kFloat &&
            sum_of_squares.is_contiguous() && sum_of_squares.device() == sum.device(),
        std::string(what) + ": sum and sum_of_squares must be contiguous fp32 [C] on one CUDA device");
  check(prologue_dtype == torch::kFloat || prologue_dtype == torch::kHalf || prologue_dtype == torch::kBFloat16,
        std::string(what) + ": the prologue dtype must be fp32 (none), fp16 or bf16");
  c10::cuda::CUDAGuard guard(sum.device());
  const int64_t channels = sum.size(0);
  const auto floats = sum.options();
  BatchNormStatsFromSums out{torch::empty({channels}, floats), torch::empty({channels}, floats),
                             torch::empty({2 * channels}, floats), torch::Tensor()};
  const bool rounded = prologue_dtype != torch::kFloat;
  if (rounded) out.scale_shift_io = torch::empty({2 * channels}, floats.dtype(prologue_dtype));
  launch(what, [&] {
    const auto side = side_of({weight, bias, running_mean, running_var, momentum, eps},
                              {out.mean, out.invstd, out.scale_shift});
    cuda::batch_norm_stats_from_sums(param_dtype_of(weight, running_mean, what),
                                     rounded ? dtype_of(out.scale_shift_io, what) : cuda::Dtype::kFloat,
                                     {sum.data_ptr<float>(), sum_of_squares.data_ptr<float>(), count}, channels, side,
                                     mutable_data_or_null(out.scale_shift_io), current_stream(sum));
  });
  return out;
}

torch::Tensor batch_norm_relu_apply(const torch::Tensor& x, const torch::Tensor& residual,
                                    const torch::Tensor& scale_shift, bool relu) {
  const char* what = "fused batch_norm_relu apply";
  check_activations(x, residual, what);
  check(scale_shift.scalar_type() == torch::kFloat && scale_shift.numel() == 2 * x.size(1),
        std::string(what) + ": scale_shift must be fp32 [2 * C]");
  c10::cuda::CUDAGuard guard(x.device());
  auto y = torch::empty_like(x);
  launch(what, [&] {
    // The parameters' dtype is no operand of the apply pass.
    const cuda::BatchNormShape shape{dtype_of(x, what), cuda::Dtype::kFloat, rows_of(x), x.size(1)};
    cuda::batch_norm_relu_apply(shape, {x.data_ptr(), data_or_null(residual), relu, y.data_ptr()},
                                scale_shift.data_ptr<float>(), current_stream(x));
  });
  return y;
}

BatchNormReluBackward batch_norm_relu_backward(const torch::Tensor& dy_in, const torch::Tensor& dy2_in,
                                               const torch::Tensor& y, const torch::Tensor& x,
                                               const torch::Tensor& mean, const torch::Tensor& invstd,
                                               const torch::Tensor& scale_shift, const torch::Tensor& weight,
                                               bool with_residual, bool relu, BatchNormPasses passes) {
  const char* what = "fused batch_norm_relu backward";
  c10::cuda::CUDAGuard guard(x.device());
  const auto gradients = kernel_gradients(dy_in, dy2_in, x, what);
  const torch::Tensor &dy = gradients.first, &dy2 = gradients.second;
  const int64_t channels = x.size(1), rows = rows_of(x);
  BatchNormReluBackward out;
  out.dx = torch::empty_like(x);
  if (with_residual) out.dresidual = torch::empty_like(x);
  if (weight.defined()) {
    out.dweight = torch::empty_like(weight);
    out.dbias = torch::empty_like(weight);
  }
  auto workspace = torch::empty({cuda::batch_norm_workspace_floats(rows, channels)}, x.options().dtype(torch::kFloat));
  launch(what, [&] {
    const cuda::BatchNormShape shape{dtype_of(x, what), param_dtype_of(weight, torch::Tensor(), what), rows, channels};
    const cuda::BatchNormReluBackwardIo io{dy.data_ptr(),
                                           data_or_null(dy2),
                                           with_residual && relu ? y.data_ptr() : nullptr,
                                           x.data_ptr(),
                                           relu,
                                           out.dx.data_ptr(),
                                           mutable_data_or_null(out.dresidual)};
    out.single_pass = cuda::batch_norm_relu_backward(
        shape, io, backward_side(weight, {mean, invstd, scale_shift}),
        {mutable_data_or_null(out.dweight), mutable_data_or_null(out.dbias)}, workspace.data_ptr<float>(),
        current_stream(x), kernel_passes(passes));
  });
  return out;
}

DualBatchNormReluBackward batch_norm_add_batch_norm_relu_backward(const torch::Tensor& dy_in, const torch::Tensor& dy2_in,
                                                                  const torch::Tensor& y, const torch::Tensor& x,
                                                                  const torch::Tensor& x2, const BatchNormStats& stats,
                                                                  const BatchNormStats& stats2,
                                                                  const torch::Tensor& weight,
                                                                  const torch::Tensor& weight2) {
  const char* what = "fused batch_norm_add_batch_norm_relu backward";
  c10::cuda::CUDAGuard guard(x.device());
  DualBatchNormReluBackward out;
  if (dual_kernels_take(x, x2, weight, weight2)) {
    const auto gradients = kernel_gradients(dy_in, dy2_in, x, what);
  const torch::Tensor &dy = gradients.first, &dy2 = gradients.second;
    const int64_t channels = x.size(1), rows = rows_of(x);
    out.dx = torch::empty_like(x);
    out.dx2 = torch::empty_like(x2);
    out.dweight = torch::empty_like(weight);
    out.dbias = torch::empty_like(weight);
    out.dweight2 = torch::empty_like(weight2);
    out.dbias2 = torch::empty_like(weight2);
    auto workspace =
        torch::empty({cuda::dual_batch_norm_workspace_floats(rows, channels)}, x.options().dtype(torch::kFloat));
    launch(what, [&] {
      const cuda::DualBatchNormReluBackwardIo io{dy.data_ptr(), data_or_null(dy2), y.data_ptr(),      x.data_ptr(),
                                                 x2.data_ptr(), out.dx.data_ptr(),  out.dx2.data_ptr()};
      out.single_pass = cuda::batch_norm_add_batch_norm_relu_backward(
          {dtype_of(x, what), dtype_of(weight, what), rows, channels}, io, backward_side(weight, stats),
          backward_side(weight2, stats2), {out.dweight.data_ptr(), out.dbias.data_ptr()},
          {out.dweight2.data_ptr(), out.dbias2.data_ptr()}, workspace.data_ptr<float>(), current_stream(x));
    });
    if (out.single_pass) return out;
  }
  // The two backwards apart: x's, which writes the residual's gradient, then the shortcut's from it.
  const auto main = batch_norm_relu_backward(dy_in, dy2_in, y, x, stats.mean, stats.invstd, stats.scale_shift, weight,
                                             /*with_residual=*/true, /*relu=*/true);
  const auto shortcut = batch_norm_relu_backward(main.dresidual, torch::Tensor(), torch::Tensor(), x2, stats2.mean,
                                                 stats2.invstd, stats2.scale_shift, weight2, /*with_residual=*/false,
                                                 /*relu=*/false);
  out.dx = main.dx;
  out.dweight = main.dweight;
  out.dbias = main.dbias;
  out.dx2 = shortcut.dx;
  out.dweight2 = shortcut.dweight;
  out.dbias2 = shortcut.dbias;
  out.single_pass = false;
  return out;
}

MaxPoolForward max_pool_forward(const torch::Tensor& x, int64_t kernel, int64_t stride, int64_t padding) {
  const char* what = "fused max_pool2d";
  check(x.is_cuda() && x.dim() == 4 && x.is_contiguous(at::MemoryFormat::ChannelsLast),
        std::string(what) + ": x must be a channels-last [N, C, H, W] CUDA tensor");
  c10::cuda::CUDAGuard guard(x.device());
  const auto shape = pool_shape(x.sizes(), kernel, stride, padding);
  check(shape.out_h > 0 && shape.out_w > 0, std::string(what) + ": input " + c10::str(x.sizes()) +
                                                " is smaller than the kernel");
  MaxPoolForward out;
  out.y = torch::empty({shape.batch, shape.channels, shape.out_h, shape.out_w},
                       x.options().memory_format(at::MemoryFormat::ChannelsLast));
  out.positions = torch::empty({shape.batch, shape.out_h, shape.out_w, shape.channels}, x.options().dtype(torch::kUInt8));
  launch(what, [&] {
    cuda::max_pool_forward(dtype_of(x, what), x.data_ptr(), shape, out.y.data_ptr(), out.positions.data_ptr<uint8_t>(),
                           current_stream(x));
  });
  return out;
}

torch::Tensor max_pool_backward(const torch::Tensor& dy_in, const torch::Tensor& positions, at::IntArrayRef x_sizes,
                                int64_t kernel, int64_t stride, int64_t padding) {
  const char* what = "fused max_pool2d backward";
  c10::cuda::CUDAGuard guard(positions.device());
  const auto shape = pool_shape(x_sizes, kernel, stride, padding);
  const auto dy = dy_in.contiguous(at::MemoryFormat::ChannelsLast);
  check(dy.sizes() == at::IntArrayRef({shape.batch, shape.channels, shape.out_h, shape.out_w}),
        std::string(what) + ": the gradient " + c10::str(dy.sizes()) + " is not shaped as the output");
  auto dx = torch::empty(x_sizes, dy.options().memory_format(at::MemoryFormat::ChannelsLast));
  launch(what, [&] {
    cuda::max_pool_backward(dtype_of(dy, what), dy.data_ptr(), positions.data_ptr<uint8_t>(), shape, dx.data_ptr(),
                            current_stream(dy));
  });
  return dx;
}

void cast_tensors(const std::vector<torch::Tensor>& src, const std::vector<torch::Tensor>& dst) {
  const char* what = "fused cast_tensors";
  check(src.size() == dst.size(), std::string(what) + ": " + std::to_string(src.size()) + " sources for " +
                                      std::to_string(dst.size()) + " destinations");
  if (src.empty()) return;
  c10::cuda::CUDAGuard guard(src[0].device());
  std::vector<cuda::CastRange> ranges;
  ranges.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    const auto& in = src[i];
    const auto& out = dst[i];
    check(in.is_cuda() && in.device() == src[0].device() && out.device() == in.device() &&
              in.scalar_type() == src[0].scalar_type() && out.scalar_type() == dst[0].scalar_type(),
          std::string(what) + ": every source of one dtype, every destination of one, all on one CUDA device");
    check(in.sizes() == out.sizes() && in.strides() == out.strides() && in.is_non_overlapping_and_dense(),
          std::string(what) + ": pair " + std::to_string(i) + " differs in shape or strides, or is not dense");
    ranges.push_back({in.data_ptr(), out.data_ptr(), in.numel()});
  }
  launch(what, [&] {
    cuda::cast_ranges(dtype_of(src[0], what), dtype_of(dst[0], what), ranges.data(), static_cast<int>(ranges.size()),
                      current_stream(src[0]));
  });
}

BatchNormReluMaxPoolForward batch_norm_relu_max_pool_forward(const torch::Tensor& x, const BatchNormParams& bn,
                                                             int64_t kernel, int64_t stride, int64_t padding) {
  const char* what = "fused batch_norm_relu_max_pool";
  check_activations(x, torch::Tensor(), what);
  c10::cuda::CUDAGuard guard(x.device());
  const auto shape = pool_shape(x.sizes(), kernel, stride, padding);
  check(shape.out_h > 0 && shape.out_w > 0, std::string(what) + ": input " + c10::str(x.sizes()) +
                                                " is smaller than the kernel");
  const auto floats = x.options().dtype(torch::kFloat);
  BatchNormReluMaxPoolForward out;
  if (one_param_dtype(bn) && bn.running_mean.defined()) {
    out.y = torch::empty({shape.batch, shape.channels, shape.out_h, shape.out_w},
                         x.options().memory_format(at::MemoryFormat::ChannelsLast));
    out.positions =
        torch::empty({shape.batch, shape.out_h, shape.out_w, shape.channels}, x.options().dtype(torch::kUInt8));
    out.stats = stats_for(shape.channels, floats);
    auto workspace = torch::empty({cuda::batch_norm_workspace_floats(rows_of(x), shape.channels)}, floats);
    launch(what, [&] {
      out.single_pass = cuda::batch_norm_relu_max_pool_forward(
          dtype_of(x, what), dtype_of(bn.weight, what), shape,
          {x.data_ptr(), out.y.data_ptr(), out.positions.data_ptr<uint8_t>()}, side_of(bn, out.stats),
          workspace.data_ptr<float>(), current_stream(x));
    });
    if (out.single_pass) return out;
  }
  // The batch norm + ReLU, then the pooling.
  const auto normalized = batch_norm_relu_forward(x, torch::Tensor(), bn.weight, bn.bias, bn.running_mean,
                                                  bn.running_var, bn.momentum, bn.eps, /*relu=*/true);
  const auto pooled = max_pool_forward(normalized.y, kernel, stride, padding);
  out.y = pooled.y;
  out.positions = pooled.positions;
  out.stats = {normalized.mean, normalized.invstd, normalized.scale_shift};
  out.single_pass = false;
  return out;
}

BatchNormReluMaxPoolBackward batch_norm_relu_max_pool_backward(const torch::Tensor& dy_in, const torch::Tensor& positions,
                                                               const torch::Tensor& x, const BatchNormStats& stats,
                                                               const torch::Tensor& weight, int64_t kernel,
                                                               int64_t stride, int64_t padding) {
  const char* what = "fused batch_norm_relu_max_pool backward";
  c10::cuda::CUDAGuard guard(x.device());
  const auto shape = pool_shape(x.sizes(), kernel, stride, padding);
  const auto dy = dy_in.to(x.scalar_type()).contiguous(at::MemoryFormat::ChannelsLast);
  check(dy.sizes() == at::IntArrayRef({shape.batch, shape.channels, shape.out_h, shape.out_w}),
        std::string(what) + ": the gradient " + c10::str(dy.sizes()) + " is not shaped as the output");
  BatchNormReluMaxPoolBackward out;
  if (weight.defined()) {
    out.dx = torch::empty_like(x);
    out.dweight = torch::empty_like(weight);
    out.dbias = torch::empty_like(weight);
    auto workspace =
        torch::empty({cuda::batch_norm_workspace_floats(rows_of(x), shape.channels)}, x.options().dtype(torch::kFloat));
    BatchNormParams bn;
    bn.weight = weight;
    launch(what, [&] {
      out.single_pass = cuda::batch_norm_relu_max_pool_backward(
          dtype_of(x, what), dtype_of(weight, what), shape,
          {dy.data_ptr(), positions.data_ptr<uint8_t>(), x.data_ptr(), out.dx.data_ptr()}, side_of(bn, stats),
          {out.dweight.data_ptr(), out.dbias.data_ptr()}, workspace.data_ptr<float>(), current_stream(x));
    });
    if (out.single_pass) return out;
  }
  // The pooling's backward, then the batch norm + ReLU's.
  const auto pooled = max_pool_backward(dy, positions, x.sizes(), kernel, stride, padding);
  const auto normalized = batch_norm_relu_backward(pooled, torch::Tensor(), torch::Tensor(), x, stats.mean, stats.invstd,
                                                   stats.scale_shift, weight, /*with_residual=*/false, /*relu=*/true);
  out.dx = normalized.dx;
  out.dweight = normalized.dweight;
  out.dbias = normalized.dbias;
  out.single_pass = false;
  return out;
}

torch::Tensor space_to_depth(const torch::Tensor& x, int64_t out_channels, int64_t out_h, int64_t out_w,
                             c10::ScalarType dtype) {
  const char* what = "fused space_to_depth";
  check(x.is_cuda() && x.dim() == 4, std::string(what) + ": x must be a [N, C, H, W] CUDA tensor");
  c10::cuda::CUDAGuard guard(x.device());
  cuda::SpaceToDepthShape shape{x.size(0), x.size(1), x.size(2), x.size(3),
                                x.stride(0), x.stride(1), x.stride(2), x.stride(3),
                                out_h, out_w, out_channels};
  auto y = torch::empty({shape.batch, out_channels, shape.out_h, shape.out_w},
                        x.options().dtype(dtype).memory_format(at::MemoryFormat::ChannelsLast));
  const cuda::Dtype out_dtype = dtype_of(y, what);
  launch(what, [&] { cuda::space_to_depth(dtype_of(x, what), out_dtype, x.data_ptr(), shape, y.data_ptr(), current_stream(x)); });
  return y;
}

AddLayerNormForward add_layer_norm_forward(const torch::Tensor& x, const torch::Tensor& branch,
                                           const torch::Tensor& weight, const torch::Tensor& bias, double eps,
                                           c10::ScalarType out_dtype, bool with_amax) {
  const char* what = "fused add_layer_norm";
  check(x.is_cuda() && x.scalar_type() == torch::kFloat && x.is_contiguous(),
        std::string(what) + ": x must be contiguous fp32 on CUDA");
  check(!branch.defined() || (branch.sizes() == x.sizes() && branch.is_contiguous()),
        std::string(what) + ": the branch must be contiguous and shaped like x");
  c10::cuda::CUDAGuard guard(x.device());
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  const auto floats = x.options();
  AddLayerNormForward out;
  if (branch.defined()) out.sum = torch::empty_like(x);
  out.out = torch::empty(x.sizes(), x.options().dtype(out_dtype));
  out.mean = torch::empty({rows}, floats);
  out.rstd = torch::empty({rows}, floats);
  if (with_amax) out.out_amax = fp8_amax_stats(x.device());
  const auto w = weight.contiguous(), b = bias.contiguous();
  launch(what, [&] {
    const cuda::LayerNormShape shape{branch.defined() ? dtype_of(branch, what) : cuda::Dtype::kFloat,
                                     dtype_of(out.out, what), rows, cols};
    const cuda::AddLayerNormForwardIo io{x.data_ptr<float>(),
                                         data_or_null(branch),
                                         branch.defined() ? out.sum.data_ptr<float>() : nullptr,
                                         out.out.data_ptr(),
                                         out.mean.data_ptr<float>(),
                                         out.rstd.data_ptr<float>(),
                                         with_amax ? amax_bits(out.out_amax) : nullptr};
    cuda::add_layer_norm_forward(shape, io, w.data_ptr<float>(), b.data_ptr<float>(), eps, current_stream(x));
  });
  return out;
}

AddLayerNormBackward add_layer_norm_backward(const torch::Tensor& grad_out_in, const torch::Tensor& grad_sum_in,
                                             const torch::Tensor& input_in, const torch::Tensor& mean,
                                             const torch::Tensor& rstd, const torch::Tensor& weight,
                                             c10::ScalarType branch_dtype, bool with_branch) {
  const char* what = "fused add_layer_norm backward";
  c10::cuda::CUDAGuard guard(input_in.device());
  // The weight and bias gradients' pass reads grad_out and input 16 bytes at a time.
  const auto grad_out = aligned16(grad_out_in.contiguous());
  const auto input = aligned16(input_in);
  const auto grad_sum = grad_sum_in.defined() ? grad_sum_in.to(torch::kFloat).contiguous() : torch::Tensor();
  const int64_t cols = input.size(-1), rows = input.numel() / cols;
  AddLayerNormBackward out;
  out.grad_x = torch::empty_like(input);
  if (with_branch) out.grad_branch = torch::empty(input.sizes(), input.options().dtype(branch_dtype));
  out.grad_weight = torch::empty_like(weight);
  out.grad_bias = torch::empty_like(weight);
  auto workspace = torch::empty({cuda::layer_norm_workspace_floats(rows, cols)}, input.options());
  const auto w = weight.contiguous();
  launch(what, [&] {
    const cuda::LayerNormShape shape{with_branch ? dtype_of(out.grad_branch, what) : cuda::Dtype::kFloat,
                                     dtype_of(grad_out, what), rows, cols};
    const cuda::AddLayerNormBackwardIo io{grad_out.data_ptr(),
                                          grad_sum.defined() ? grad_sum.data_ptr<float>() : nullptr,
                                          input.data_ptr<float>(),
                                          mean.data_ptr<float>(),
                                          rstd.data_ptr<float>(),
                                          out.grad_x.data_ptr<float>(),
                                          mutable_data_or_null(out.grad_branch)};
    cuda::add_layer_norm_backward(shape, io, w.data_ptr<float>(), out.grad_weight.data_ptr<float>(),
                                  out.grad_bias.data_ptr<float>(), workspace.data_ptr<float>(), current_stream(input));
  });
  return out;
}

namespace {

// The shape's own bounds (cols a multiple of 8, rows positive) are the launcher's to check (column_sums.cuh).
void check_bias_gradient_input(const torch::Tensor& grad, const char* what) {
  check(grad.is_cuda() && grad.dim() == 2 && grad.is_contiguous(),
        std::string(what) + ": the gradient must be a contiguous [rows, cols] CUDA tensor, got shape " +
            c10::str(grad.sizes()));
}

}  // namespace

torch::Tensor bias_gradient(const torch::Tensor& grad_in, c10::ScalarType bias_dtype) {
  const char* what = "fused bias_gradient";
  check_bias_gradient_input(grad_in, what);
  c10::cuda::CUDAGuard guard(grad_in.device());
  const auto grad = aligned16(grad_in);
  const int64_t rows = grad.size(0), cols = grad.size(1);
  auto out = torch::empty({cols}, grad.options().dtype(bias_dtype));
  auto workspace = torch::empty({cuda::bias_gradient_workspace_floats(rows, cols)}, grad.options().dtype(torch::kFloat));
  launch(what, [&] {
    const cuda::BiasGradientShape shape{dtype_of(grad, what), dtype_of(out, what), rows, cols};
    cuda::bias_gradient(shape, grad.data_ptr(), out.data_ptr(), workspace.data_ptr<float>(), current_stream(grad));
  });
  return out;
}

GeluBiasGradient gelu_backward_bias_gradient(const torch::Tensor& grad_in, const torch::Tensor& gelu_input_in,
                                             c10::ScalarType bias_dtype) {
  const char* what = "fused gelu_backward_bias_gradient";
  check_bias_gradient_input(grad_in, what);
  check(gelu_input_in.sizes() == grad_in.sizes() && gelu_input_in.scalar_type() == grad_in.scalar_type() &&
            gelu_input_in.device() == grad_in.device(),
        std::string(what) + ": GELU's input must be shaped, typed and placed as the gradient");
  c10::cuda::CUDAGuard guard(grad_in.device());
  const auto grad = aligned16(grad_in);
  const auto gelu_input = aligned16(gelu_input_in.contiguous());
  const int64_t rows = grad.size(0), cols = grad.size(1);
  GeluBiasGradient out{torch::empty_like(grad), torch::empty({cols}, grad.options().dtype(bias_dtype))};
  auto workspace = torch::empty({cuda::bias_gradient_workspace_floats(rows, cols)}, grad.options().dtype(torch::kFloat));
  launch(what, [&] {
    const cuda::BiasGradientShape shape{dtype_of(grad, what), dtype_of(out.grad_bias, what), rows, cols};
    const cuda::GeluBackwardIo io{grad.data_ptr(), gelu_input.data_ptr(), out.grad_input.data_ptr()};
    cuda::gelu_backward_bias_gradient(shape, io, out.grad_bias.data_ptr(), workspace.data_ptr<float>(),
                                      current_stream(grad));
  });
  return out;
}

GeluForward gelu_tanh_forward(const torch::Tensor& x_in, bool with_amax) {
  const char* what = "fused gelu_tanh_forward";
  check(x_in.is_cuda(), std::string(what) + ": x must be a CUDA tensor");
  c10::cuda::CUDAGuard guard(x_in.device());
  const auto x = x_in.contiguous();
  GeluForward out{torch::empty_like(x), with_amax ? fp8_amax_stats(x.device()) : torch::Tensor()};
  launch(what, [&] {
    cuda::gelu_tanh_forward(dtype_of(x, what), x.data_ptr(), out.y.data_ptr(), x.numel(),
                            with_amax ? amax_bits(out.amax) : nullptr, current_stream(x));
  });
  return out;
}

GeluBackward gelu_tanh_backward(const torch::Tensor& grad_in, const torch::Tensor& x_in, bool with_amax) {
  const char* what = "fused gelu_tanh_backward";
  check(grad_in.is_cuda() && x_in.device() == grad_in.device() && x_in.sizes() == grad_in.sizes() &&
            x_in.scalar_type() == grad_in.scalar_type(),
        std::string(what) + ": the gradient and GELU's input must be CUDA tensors of one shape and dtype");
  c10::cuda::CUDAGuard guard(grad_in.device());
  const auto grad = grad_in.contiguous(), x = x_in.contiguous();
  GeluBackward out{torch::empty_like(grad), with_amax ? fp8_amax_stats(grad.device()) : torch::Tensor()};
  launch(what, [&] {
    cuda::gelu_tanh_backward(dtype_of(grad, what), grad.data_ptr(), x.data_ptr(), out.grad_x.data_ptr(), grad.numel(),
                             with_amax ? amax_bits(out.amax) : nullptr, current_stream(grad));
  });
  return out;
}

torch::Tensor fp8_amax_stats(const torch::Device& device) {
  return torch::zeros({3 * cuda::kFp8StatsStride}, torch::TensorOptions().dtype(torch::kFloat).device(device));
}

bool available(const torch::Device& device) { return device.is_cuda(); }

Fp8Cast fp8_cast(const torch::Tensor& x_in, bool e5m2, Fp8CastExtras extras) {
  const char* what = "fused fp8 cast";
  check(x_in.is_cuda(), std::string(what) + ": x must be a CUDA tensor");
  check(extras.transposed || (!extras.column_sums && extras.delayed == nullptr),
        std::string(what) + ": column sums and delayed scaling come with the transposed cast");
  const bool amax_given = extras.amax_stats.defined();
  check(!amax_given || extras.delayed == nullptr,
        std::string(what) + ": a given amax is dynamic scaling's; delayed scaling takes its history's");
  check(!amax_given || (extras.amax_stats.device() == x_in.device() && extras.amax_stats.scalar_type() == torch::kFloat &&
                        extras.amax_stats.is_contiguous() && extras.amax_stats.numel() == 3 * cuda::kFp8StatsStride),
        std::string(what) + ": a given amax comes in fp8_amax_stats' buffer on x's device");
  c10::cuda::CUDAGuard guard(x_in.device());
  const auto x = x_in.contiguous();
  const auto stats =
      amax_given ? extras.amax_stats : torch::empty({3 * cuda::kFp8StatsStride}, x.options().dtype(torch::kFloat));
  const auto fp8 = x.options().dtype(compat::float8_dtype(e5m2));
  Fp8Cast out{torch::empty(x.sizes(), fp8), stats[0], stats[cuda::kFp8StatsStride], stats[2 * cuda::kFp8StatsStride],
              {}, {}};
  auto* data = static_cast<uint8_t*>(out.data.data_ptr());
  if (!extras.transposed) {
    launch(what, [&] {
      cuda::fp8_scaled_cast(dtype_of(x, what), x.data_ptr(), x.numel(), e5m2, data, stats.data_ptr<float>(),
                            current_stream(x), amax_given);
    });
    return out;
  }
  check(x.dim() >= 1, std::string(what) + ": a transposed cast needs at least one dimension");
  const int64_t cols = x.size(-1), rows = cols == 0 ? 0 : x.numel() / cols;
  out.transposed = torch::empty({cols, rows}, fp8);
  torch::Tensor partials;
  if (extras.column_sums)
    partials = torch::empty({cuda::fp8_column_partial_rows(rows), cols}, x.options().dtype(torch::kFloat));
  cuda::Fp8DelayedScaling delayed;
  if (extras.delayed != nullptr) {
    const auto& state = extras.delayed->state;
    check(state.defined() && state.is_cuda() && state.device() == x.device() && state.scalar_type() == torch::kFloat &&
              state.dim() == 1 && state.numel() >= 2 && state.is_contiguous(),
          std::string(what) + ": a delayed scaling state is a contiguous fp32 vector of 2 or more on x's device");
    delayed = {state.data_ptr<float>(), state.numel() - 1, extras.delayed->primed};
  }
  launch(what, [&] {
    cuda::fp8_scaled_cast_transposed(dtype_of(x, what), rows, cols, e5m2,
                                     {x.data_ptr(), data, static_cast<uint8_t*>(out.transposed.data_ptr()),
                                      static_cast<float*>(mutable_data_or_null(partials)), stats.data_ptr<float>(),
                                      amax_given},
                                     delayed, current_stream(x));
  });
  if (extras.delayed != nullptr) extras.delayed->primed = true;
  if (extras.column_sums) out.column_sums = rows == 0 ? torch::zeros({cols}, partials.options()) : partials.sum(0);
  return out;
}

CrossEntropyRows cross_entropy_forward(const torch::Tensor& logits, const torch::Tensor& labels_in, int64_t classes) {
  check_rows_and_labels(logits, labels_in, "fused cross_entropy");
  check(classes > 0 && classes <= logits.size(1), "fused cross_entropy: " + std::to_string(classes) +
                                                      " classes in logits of width " + std::to_string(logits.size(1)));
  c10::cuda::CUDAGuard guard(logits.device());
  const auto labels = labels_in.contiguous();
  const int64_t rows = logits.size(0);
  const auto options = logits.options().dtype(torch::kFloat);
  CrossEntropyRows out{torch::empty({rows}, options), torch::empty({rows}, options), torch::empty({rows}, options)};
  launch("fused cross_entropy", [&] {
    const cuda::CrossEntropyLogits in{dtype_of(logits, "fused cross_entropy"), logits.data_ptr(), rows, classes,
                                    logits.stride(0), labels.data_ptr<int64_t>()};
    cuda::cross_entropy_forward(in, out.loss.data_ptr<float>(), out.lse.data_ptr<float>(),
                                out.correct.data_ptr<float>(), current_stream(logits));
  });
  return out;
}

torch::Tensor cross_entropy_backward(const torch::Tensor& logits, const torch::Tensor& labels_in,
                                     const torch::Tensor& lse, const torch::Tensor& scale_in, int64_t classes) {
  check_rows_and_labels(logits, labels_in, "fused cross_entropy backward");
  c10::cuda::CUDAGuard guard(logits.device());
  const auto labels = labels_in.contiguous();
  const auto scale = scale_in.to(logits.device(), torch::kFloat).contiguous();
  check(scale.numel() == 1, "fused cross_entropy backward: the scale must hold one value");
  auto grad = torch::empty({logits.size(0), logits.size(1)}, logits.options());
  launch("fused cross_entropy backward", [&] {
    const cuda::CrossEntropyLogits in{dtype_of(logits, "fused cross_entropy backward"), logits.data_ptr(),
                                    logits.size(0), classes, logits.stride(0), labels.data_ptr<int64_t>()};
    cuda::cross_entropy_backward(in, logits.size(1), lse.data_ptr<float>(), scale.data_ptr<float>(), grad.data_ptr(),
                                 grad.stride(0), current_stream(logits));
  });
  return grad;
}

namespace {

// The graph's shape for x and weight, or why the fusion does not apply to them.
std::string conv_stats_shape_problem(const torch::Tensor& x, const torch::Tensor& weight, int64_t stride,
                                     int64_t padding) {
  if (!x.is_cuda() || weight.device() != x.device()) return "x and weight must be on one CUDA device";
  if (x.dim() != 4 || weight.dim() != 4) return "x and weight must be 4-D";
  if (x.scalar_type() != torch::kHalf && x.scalar_type() != torch::kBFloat16) return "x must be fp16 or bf16";
  if (weight.scalar_type() != x.scalar_type()) return "weight must have x's dtype";
  if (weight.size(1) != x.size(1) || weight.size(2) != weight.size(3)) return "weight must be [K, C, R, R]";
  if (x.size(1) % 8 != 0 || weight.size(0) % 8 != 0) return "channels must be multiples of 8";
  if (stride < 1 || padding < 0) return "stride must be positive and padding non-negative";
  if (x.size(2) + 2 * padding < weight.size(2) || x.size(3) + 2 * padding < weight.size(3))
    return "the filter is larger than the padded input";
  return {};
}

cudnn::ConvStatsShape conv_stats_shape(const torch::Tensor& x, const torch::Tensor& weight, int64_t stride,
                                       int64_t padding, bool prologue) {
  cudnn::ConvStatsShape s;
  s.n = x.size(0), s.c = x.size(1), s.h = x.size(2), s.w = x.size(3);
  s.k = weight.size(0), s.r = weight.size(2), s.stride = stride, s.padding = padding;
  s.dtype = x.scalar_type() == torch::kHalf ? cudnn::Dtype::kHalf : cudnn::Dtype::kBFloat16;
  s.prologue = prologue;
  return s;
}

// Why the fusion does not apply to these arguments (empty when it does), with the plan's info when the shape
// fits: one plan lookup for both the question and the launch.
std::string conv_stats_problem(const torch::Tensor& x, const torch::Tensor& weight, int64_t stride, int64_t padding,
                               bool prologue, cudnn::ConvStatsPlanInfo* plan, bool precompiled_only = false) {
  std::string problem = conv_stats_shape_problem(x, weight, stride, padding);
  if (!problem.empty()) return problem;
  c10::cuda::CUDAGuard guard(x.device());
  *plan = cudnn::conv_stats_plan(conv_stats_shape(x, weight, stride, padding, prologue));
  if (!plan->supported) return plan->why_not;
  if (precompiled_only && plan->runtime_compiled)
    return "cuDNN's engine " + std::to_string(plan->engine) + " for it compiles its kernel at run time";
  // The fp16 engine's sums vary from run to run in their last bits (the same eager ResNet-20 run gave losses
  // differing in the third digit on one H200 between calls) although its numerical notes do not say so: a run
  // that asks for deterministic cuDNN keeps the unfused kernels.
  if (precompiled_only && at::globalContext().deterministicCuDNN())
    return std::string("deterministic cuDNN was asked for, and cuDNN's engine ") + std::to_string(plan->engine) +
           " for it sums the statistics in an order that varies from run to run" +
           (plan->nondeterministic ? "" : " (its numerical notes do not say so)");
  return {};
}

}  // namespace

bool conv_stats_supported(const torch::Tensor& x, const torch::Tensor& weight, int64_t stride, int64_t padding,
                          bool prologue, std::string* why_not, bool precompiled_only) {
  cudnn::ConvStatsPlanInfo plan;
  const std::string problem = conv_stats_problem(x, weight, stride, padding, prologue, &plan, precompiled_only);
  if (why_not) *why_not = problem;
  return problem.empty();
}

ConvStats conv_stats(const torch::Tensor& x, const torch::Tensor& weight, int64_t stride, int64_t padding,
                     const torch::Tensor& scale, const torch::Tensor& shift) {
  const bool prologue = scale.defined();
  cudnn::ConvStatsPlanInfo info;
  const std::string problem = conv_stats_problem(x, weight, stride, padding, prologue, &info);
  check(problem.empty(), "fused conv_stats: " + problem);
  check(!prologue || (shift.defined() && scale.numel() == x.size(1) && shift.numel() == x.size(1)),
        "fused conv_stats: scale and shift must both be [C]");
  c10::cuda::CUDAGuard guard(x.device());
  const auto shape = conv_stats_shape(x, weight, stride, padding, prologue);
  const auto xc = x.contiguous(at::MemoryFormat::ChannelsLast);
  const auto wc = weight.contiguous(at::MemoryFormat::ChannelsLast);
  torch::Tensor scale_io, shift_io;
  if (prologue) {
    scale_io = scale.reshape({-1}).to(x.scalar_type()).contiguous();
    shift_io = shift.reshape({-1}).to(x.scalar_type()).contiguous();
  }
  ConvStats out;
  out.y = torch::empty({shape.n, shape.k, shape.out_h(), shape.out_w()},
                       x.options().memory_format(at::MemoryFormat::ChannelsLast));
  // cuDNN does not say whether genstats overwrites its outputs or adds to them: they start at zero (one memset
  // for both), so that the sums never depend on what the memory held.
  const auto sums = torch::zeros({2 * shape.k}, x.options().dtype(torch::kFloat));
  out.sum = sums.narrow(0, 0, shape.k);
  out.sum_of_squares = sums.narrow(0, shape.k, shape.k);
  auto workspace = torch::empty({static_cast<int64_t>(info.workspace_bytes)}, x.options().dtype(torch::kUInt8));
  launch("fused conv_stats", [&] {
    cudnn::conv_stats(shape, xc.data_ptr(), wc.data_ptr(), data_or_null(scale_io), data_or_null(shift_io),
                      out.y.data_ptr(), out.sum.data_ptr<float>(), out.sum_of_squares.data_ptr<float>(),
                      info.workspace_bytes ? workspace.data_ptr() : nullptr, current_stream(x));
  });
  return out;
}

}  // namespace ptrain::kernels::fused
