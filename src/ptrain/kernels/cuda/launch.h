// The CUDA kernels' launchers, on raw device pointers: what nvcc compiles (cuda/*.cu) sees no LibTorch
// header, and fused_cuda.cpp turns tensors into these arguments. Every launcher checks its launch and
// throws std::runtime_error with CUDA's message.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace ptrain::kernels::cuda {

enum class Dtype { kFloat, kHalf, kBFloat16 };

// The rows of logits (dtype) that both directions read: row r's first classes values (row_stride elements
// apart, unit stride within a row) and its label, labels[r].
struct CrossEntropyLogits {
  Dtype dtype;
  const void* logits;
  int64_t rows, classes, row_stride;
  const int64_t* labels;
};

// loss[r] = logsumexp(row) - row[label] (NaN for a label outside [0, classes)), lse[r] = logsumexp(row),
// correct[r] = 1 when the row's first largest value is at the label, else 0. All in fp32.
void cross_entropy_forward(const CrossEntropyLogits& in, float* loss, float* lse, float* correct, cudaStream_t stream);

// grad[r][c] = (exp(row[c] - lse[r]) - (c == labels[r])) * (*scale) for c < classes, 0 for classes <= c <
// width (a padded vocabulary's columns), in the logits' dtype (grad rows are grad_row_stride apart). scale is
// read on the device: the upstream gradient over the rows averaged.
void cross_entropy_backward(const CrossEntropyLogits& in, int64_t width, const float* lse, const float* scale,
                            void* grad, int64_t grad_row_stride, cudaStream_t stream);

}  // namespace ptrain::kernels::cuda

namespace ptrain::kernels::cuda {

// Batch normalisation in training mode over NHWC activations seen as [rows, channels] (rows = N*H*W,
// channels a multiple of 16 bytes' worth of elements, 16-byte aligned), fused with the ReLU that follows it
// and, optionally, the residual added before that ReLU: y = relu(x * a + b [+ residual]) with a, b per channel
// from the batch's mean and variance. Parameters and running statistics are `param` dtype (fp32, or the
// activations' dtype). Statistics in fp32 (Welford within threads, Chan's merge across them).
struct BatchNormShape {
  Dtype dtype;  // the activations'
  Dtype param;  // the parameters' and running statistics'
  int64_t rows, channels;
};

// One batch norm's parameters, running statistics (updated with momentum, the variance unbiased, as
// torch.nn.BatchNorm2d does), and its outputs for the backward. The backwards read mean, invstd, scale_shift
// and weight only. Also a kernel argument of the single-pass kernels that take two batch norms (below).
struct BatchNormSide {
  const void* weight;
  const void* bias;
  void* running_mean;
  void* running_var;
  double momentum, eps;
  float* mean;         // [channels], written forward, read backward
  float* invstd;       // [channels]
  float* scale_shift;  // [2 * channels]
};
struct BatchNormGrads {
  void* dweight;
  void* dbias;
};

// The activations a forward reads and writes: y = relu(x * scale + shift [+ residual]), residual null for none;
// without relu, y = x * scale + shift [+ residual].
struct BatchNormReluForwardIo {
  const void* x;
  const void* residual;
  bool relu;
  void* y;
};

// The activations a backward reads and writes: dx, and dresidual = dy masked (null when there is no residual).
// The ReLU's mask is the sign of y with a residual (y given), and of x * scale + shift without (y null),
// scale_shift being the forward's; without relu, the backward of bn(x) [+ residual] (y unused). dy2 (may be
// null): the gradient of a second use of the output, summed with dy as the passes load them.
struct BatchNormReluBackwardIo {
  const void* dy;
  const void* dy2;
  const void* y;
  const void* x;
  bool relu;
  void* dx;
  void* dresidual;
};

// batch_norm_stats writes side.mean, invstd and scale_shift and updates the running statistics when they are
// given. workspace needs batch_norm_workspace_floats(rows, channels) floats.
int64_t batch_norm_workspace_floats(int64_t rows, int64_t channels);
// How batch_norm_relu_forward and _backward run. kSplit: three launches (reduce, finalize, apply), each pass
// reading the activations from memory. kSinglePass: one cooperative launch whose blocks meet at grid-wide
// barriers between the passes, the apply phase finding small layers' activations in L2; possible only when
// the whole grid can be resident. kAuto: the single pass where possible (faster at every ResNet-50 shape).
enum class BatchNormPasses { kAuto, kSplit, kSinglePass };
// phase_stamps (a bench's; null in training): where the single pass runs, thread 0 of each block writes the GPU's
// nanosecond clock at its start, when its statistics are read, after the first barrier, when its channels are
// finalized, after the second barrier and when its rows are applied: kBatchNormForwardStamps values a block, for at
// most 512 blocks; *phase_blocks (when given) receives the number of blocks.
constexpr int kBatchNormForwardStamps = 6;
struct BatchNormForwardRun {
  BatchNormPasses passes = BatchNormPasses::kAuto;
  unsigned long long* phase_stamps = nullptr;
  int64_t* phase_blocks = nullptr;
};
// batch_norm_stats then batch_norm_relu_apply, as one launch or three (run.passes); true when the single pass ran.
bool batch_norm_relu_forward(const BatchNormShape& shape, const BatchNormReluForwardIo& io, const BatchNormSide& side,
                             float* workspace, cudaStream_t stream, const BatchNormForwardRun& run = {});
void batch_norm_stats(const BatchNormShape& shape, const void* x, const BatchNormSide& side, float* workspace,
                      cudaStream_t stream);
// A convolution's per-channel sum and sum of squares of its output over count values a channel (cuDNN's genstats).
struct ChannelSums {
  const float* sum;
  const float* sum_of_squares;
  int64_t count;
};
// What batch_norm_stats writes, from sums instead of a pass over x. io kHalf or kBFloat16: scale and shift rounded
// to it, written in it to scale_shift_io [2 * channels] too (a convolution prologue's operands), and the rounded
// values in side.scale_shift; io kFloat: no rounding, scale_shift_io unused (null).
void batch_norm_stats_from_sums(Dtype param, Dtype io, const ChannelSums& sums, int64_t channels,
                                const BatchNormSide& side, void* scale_shift_io, cudaStream_t stream);
// io.y from io.x (and io.residual) with the statistics' scale_shift = [scale[channels], shift[channels]];
// shape.param unused.
void batch_norm_relu_apply(const BatchNormShape& shape, const BatchNormReluForwardIo& io, const float* scale_shift,
                           cudaStream_t stream);
// The backward of y = relu(bn(x) [+ residual]): io.dx and io.dresidual, and grads (param dtype; each may be null
// when not needed), from side's statistics and weight. True when the single pass ran.
bool batch_norm_relu_backward(const BatchNormShape& shape, const BatchNormReluBackwardIo& io, const BatchNormSide& side,
                              const BatchNormGrads& grads, float* workspace, cudaStream_t stream,
                              BatchNormPasses passes = BatchNormPasses::kAuto);

// relu(bn(x) + bn2(x2)), a ResNet block whose shortcut has a convolution and batch norm of its own:
// y = relu(x * scale + shift + x2 * scale2 + shift2) with both batch norms' statistics, in one cooperative launch
// (both shortcuts' passes and the add in one); false, nothing run, where the grid cannot be resident at once
// (the caller then runs the two batch norms apart). workspace: dual_batch_norm_workspace_floats.
int64_t dual_batch_norm_workspace_floats(int64_t rows, int64_t channels);
bool batch_norm_add_batch_norm_relu_forward(const BatchNormShape& shape, const void* x, const void* x2,
                                            const BatchNormSide& side, const BatchNormSide& side2, void* y,
                                            float* workspace, cudaStream_t stream);
// Its backward from dy (and dy2, a second use's gradient, or null), with the mask y > 0: dx, dx2 and both
// sides' dweight and dbias. false, nothing run, as above.
struct DualBatchNormReluBackwardIo {
  const void* dy;
  const void* dy2;
  const void* y;
  const void* x;
  const void* x2;
  void* dx;
  void* dx2;
};
bool batch_norm_add_batch_norm_relu_backward(const BatchNormShape& shape, const DualBatchNormReluBackwardIo& io,
                                             const BatchNormSide& side, const BatchNormSide& side2,
                                             const BatchNormGrads& grads, const BatchNormGrads& grads2,
                                             float* workspace, cudaStream_t stream);

}  // namespace ptrain::kernels::cuda

namespace ptrain::kernels::cuda {

// Layer normalisation over the last dimension of [rows, cols] fp32 rows (cols a multiple of 8), with the
// residual add before it fused in: sum = x + branch (when branch is given; branch in branch_dtype), out =
// (sum - mean) * rstd * weight + bias in out_dtype (fp32 weight and bias), mean and rstd per row in fp32.
// One warp a row.
struct LayerNormShape {
  Dtype branch_dtype;  // kFloat without a branch
  Dtype out_dtype;
  int64_t rows, cols;
};
struct AddLayerNormForwardIo {
  const float* x;
  const void* branch;  // null: none
  float* sum;          // null without a branch
  void* out;
  float* mean;
  float* rstd;
  // null: none. Else the bits of a non-negative fp32, zero or a lower bound, that the kernel raises (atomicMax) to
  // the largest |out| as written in out_dtype: the amax of out's FP8 cast (fp8_scaled_cast's amax_given).
  unsigned int* out_amax = nullptr;
};
void add_layer_norm_forward(const LayerNormShape& shape, const AddLayerNormForwardIo& io, const float* weight,
                            const float* bias, double eps, cudaStream_t stream);

// Its backward from grad_out (out_dtype) and, when given, the gradient reaching sum from its other uses
// (grad_sum, fp32): grad_input (fp32: x's gradient, and the branch's in grad_branch, branch_dtype, when
// given), grad_weight and grad_bias (fp32). input is sum (or x without a branch). workspace needs
// layer_norm_workspace_floats(rows, cols) floats.
struct AddLayerNormBackwardIo {
  const void* grad_out;
  const float* grad_sum;  // may be null
  const float* input;
  const float* mean;
  const float* rstd;
  float* grad_input;
  void* grad_branch;  // null without a branch
};
int64_t layer_norm_workspace_floats(int64_t rows, int64_t cols);
void add_layer_norm_backward(const LayerNormShape& shape, const AddLayerNormBackwardIo& io, const float* weight,
                             float* grad_weight, float* grad_bias, float* workspace, cudaStream_t stream);

}  // namespace ptrain::kernels::cuda

namespace ptrain::kernels::cuda {

// Square max pooling (no dilation, output size floor((in + 2 padding - kernel) / stride) + 1) over NHWC
// activations [batch, in_h, in_w, channels] (channels a multiple of 16 bytes' worth, 16-byte aligned).
struct PoolShape {
  int64_t batch, channels, in_h, in_w, out_h, out_w;
  int kernel, stride, padding;
};
// y [batch, out_h, out_w, channels], and positions (same shape, one byte each): where in its window (row-major,
// kernel * kernel <= 255) each output's maximum was, for the backward.
void max_pool_forward(Dtype dtype, const void* x, const PoolShape& shape, void* y, uint8_t* positions,
                      cudaStream_t stream);
// dx [batch, in_h, in_w, channels]: each input's sum of the gradients dy of the outputs whose maximum it was.
void max_pool_backward(Dtype dtype, const void* dy, const uint8_t* positions, const PoolShape& shape, void* dx,
                       cudaStream_t stream);

}  // namespace ptrain::kernels::cuda

namespace ptrain::kernels::cuda {

// max_pool(relu(bn(x))) for ResNet's stem, x NHWC [pool.batch, pool.in_h, pool.in_w, pool.channels], the batch norm
// in training mode (side: its parameters, running statistics and outputs for the backward): the statistics, then
// y and positions as max_pool_forward writes them, straight from x, in one cooperative launch; false, nothing run,
// where the grid cannot be resident (the caller then runs the batch norm and the pooling apart). workspace:
// batch_norm_workspace_floats(rows of x, channels).
struct BatchNormReluMaxPoolForwardIo {
  const void* x;
  void* y;
  uint8_t* positions;
};
bool batch_norm_relu_max_pool_forward(Dtype dtype, Dtype param, const PoolShape& pool,
                                      const BatchNormReluMaxPoolForwardIo& io, const BatchNormSide& side,
                                      float* workspace, cudaStream_t stream);
// Its backward from the pooled gradient dy and the positions: dx, dweight and dbias, in one cooperative launch, for
// a 3x3 stride-2 padding-1 pooling; false, nothing run, for another pooling or where the grid cannot be resident.
struct BatchNormReluMaxPoolBackwardIo {
  const void* dy;
  const uint8_t* positions;
  const void* x;
  void* dx;
};
bool batch_norm_relu_max_pool_backward(Dtype dtype, Dtype param, const PoolShape& pool,
                                       const BatchNormReluMaxPoolBackwardIo& io, const BatchNormSide& side,
                                       const BatchNormGrads& grads, float* workspace, cudaStream_t stream);

}  // namespace ptrain::kernels::cuda

namespace ptrain::kernels::cuda {

// FP8 casts with tensorwise dynamic scaling (torchao's Float8Linear): over the n elements of x (dtype),
// amax = max |x|, scale = fp8_max / max(amax, 1e-12) (fp32, IEEE division; fp8_max 448 for E4M3, 57344 for
// E5M2), y[i] = fp8(clamp(x[i] * scale, -fp8_max, fp8_max)) rounded to nearest even, inv_scale = 1 / scale
// (what the FP8 matrix product multiplies its result by). stats receives amax, scale and inv_scale at
// stats[0], stats[kFp8StatsStride] and stats[2 * kFp8StatsStride]: cuBLASLt's FP8 GEMM refuses a scale whose
// address is not 16-byte aligned (CUBLAS_STATUS_NOT_SUPPORTED), so each gets 16 bytes of its own.
// Two kernels on stream after zeroing stats[0]: a grid-wide amax (each block's maximum into stats[0] by
// atomicMax on the bits of |x|, which order as the floats do), then the scale and cast, every thread
// computing the scale from stats[0]. Nothing is read back on the host: capturable in a CUDA graph.
// Bit for bit what LibTorch's abs().max(), clamp_min, div, mul, clamp and cast to Float8 give.
constexpr int64_t kFp8StatsStride = 4;  // floats: 16 bytes
// amax_given: stats[0] already holds x's amax, written by the kernel that wrote x (add_layer_norm_forward's
// out_amax, gelu_tanh_forward's amax): the cast skips its amax pass and reads x once.
void fp8_scaled_cast(Dtype dtype, const void* x, int64_t n, bool e5m2, uint8_t* y, float* stats, cudaStream_t stream,
                     bool amax_given = false);
// The same cast of x viewed as [rows, cols] (both multiples of 16; outputs 16-byte aligned), writing y (row-major,
// skipped when null) and yt = y^T stored row-major [cols, rows], in one pass after the amax: cuBLASLt's FP8 GEMM
// takes its second operand column-major, and the linear's backward needs the gradient and x transposed.
// column_partials (skipped when null): [fp8_column_partial_rows(rows), cols] fp32, row p the sums of x's columns
// over rows 64p..64p+63, summed in order; their sum down the rows is x's column sums (a linear's bias gradient,
// read from the gradient while it is cast rather than in a pass of its own).
// delayed (its state null: dynamic scaling, the amax of x itself): delayed scaling, as Transformer Engine's
// DelayedScaling with amax_compute_algo "max": the scale comes from the largest amax of the last history_len casts
// of this tensor's role (state[1..history_len], newest first, fp32 on the device), and the cast records x's amax
// into state[0] in its own pass, for the next cast to take into the history: no amax pass before the cast.
// Values beyond the history's range saturate at fp8_max. The first cast (primed false) takes x's amax first, so
// that it scales as dynamic scaling does. stats[0] receives the history's largest amax.
struct Fp8DelayedScaling {
  float* state = nullptr;  // history_len + 1 floats, zeros before the first cast
  int64_t history_len = 0;
  bool primed = false;
};
int64_t fp8_column_partial_rows(int64_t rows);
struct Fp8CastTransposedIo {
  const void* x;  // [rows, cols] in the cast's dtype
  uint8_t* y;
  uint8_t* yt;
  float* column_partials;
  float* stats;
  bool amax_given = false;  // as fp8_scaled_cast's; dynamic scaling only
};
void fp8_scaled_cast_transposed(Dtype dtype, int64_t rows, int64_t cols, bool e5m2, const Fp8CastTransposedIo& io,
                                const Fp8DelayedScaling& delayed, cudaStream_t stream);

}  // namespace ptrain::kernels::cuda

namespace ptrain::kernels::cuda {

// x [batch, channels, in_h, in_w] at any element strides; the output [batch, out_h, out_w, out_channels]
// contiguous (NHWC), out_channels >= 4 * channels.
struct SpaceToDepthShape {
  int64_t batch, channels, in_h, in_w;
  int64_t stride_n, stride_c, stride_h, stride_w;
  int64_t out_h, out_w, out_channels;
};
// y[n, i, j, (s * 2 + t) * channels + c] = x[n, c, 2i + s - 4, 2j + t - 4] (zero outside x), zero for the
// channels from 4 * channels on; read in dtype `in`, written in `out` (round to nearest even).
void space_to_depth(Dtype in, Dtype out, const void* x, const SpaceToDepthShape& shape, void* y, cudaStream_t stream);

}  // namespace ptrain::kernels::cuda

namespace ptrain::kernels::cuda {

// count ranges cast element for element, src[0 .. numel) in dtype in to dst in dtype out (round to nearest even),
// kMaxCastRanges a launch: a group of parameters' casts under autocast, and their gradients' casts back, which
// LibTorch runs as a kernel each (kernels/parameter_cast.h).
constexpr int kMaxCastRanges = 32;
struct CastRange {
  const void* src;
  void* dst;
  int64_t numel;
};
void cast_ranges(Dtype in, Dtype out, const CastRange* ranges, int count, cudaStream_t stream);

}  // namespace ptrain::kernels::cuda

namespace ptrain::kernels::cuda {

// A linear layer's bias gradient from the gradient of its output, [rows, cols] row-major in dtype (cols a
// multiple of 8, 16-byte aligned): its column sums, added in fp32 in an order fixed by the shape, written in
// bias_dtype. workspace: bias_gradient_workspace_floats(rows, cols) floats.
struct BiasGradientShape {
  Dtype dtype;
  Dtype bias_dtype;
  int64_t rows, cols;
};
int64_t bias_gradient_workspace_floats(int64_t rows, int64_t cols);
void bias_gradient(const BiasGradientShape& shape, const void* grad, void* grad_bias, float* workspace,
                   cudaStream_t stream);

// The same for a linear layer followed by GELU (tanh approximation): grad_input = grad * gelu'(gelu_input), each
// [rows, cols] in dtype, and the bias gradient the column sums of grad_input as written.
struct GeluBackwardIo {
  const void* grad;        // the gradient of GELU's output
  const void* gelu_input;  // the linear layer's output
  void* grad_input;        // may be grad itself
};
void gelu_backward_bias_gradient(const BiasGradientShape& shape, const GeluBackwardIo& io, void* grad_bias,
                                 float* workspace, cudaStream_t stream);

// y = GELU(x) (tanh approximation) over n elements of dtype, in LibTorch's fp32 steps, rounded to dtype; amax
// (may be null; as add_layer_norm_forward's out_amax) raised to the largest |y| as written: what --precision fp8's
// cast of the MLP's hidden activations scales by, read from the pass that writes them.
void gelu_tanh_forward(Dtype dtype, const void* x, void* y, int64_t n, unsigned int* amax, cudaStream_t stream);
// Its backward, grad_x = grad * gelu'(x) over n elements of dtype (LibTorch's GeluBackward steps, as
// gelu_backward_bias_gradient's), and amax (may be null) raised to the largest |grad_x| as written: what the FP8 cast
// of the MLP's c_fc output gradient scales by.
void gelu_tanh_backward(Dtype dtype, const void* grad, const void* x, void* grad_x, int64_t n, unsigned int* amax,
                        cudaStream_t stream);

}  // namespace ptrain::kernels::cuda
