// Times ptrain's NHWC batch-norm kernels (src/ptrain/kernels/cuda/batch_norm.cu) at the 53 batch-norm shapes of
// a ResNet-50 training step, one launcher at a time, and prints each one's time beside a device-to-device copy
// of the same tensor: where the kernels fall short of the memory system, and at which sizes. The step's trace
// sums kernels over the whole network; this says which layers and which passes make up those sums.
//
//   batch_norm_bench [--batch 128] [--image 224] [--dtype bf16|fp16|fp32] [--reps 20] [--warm] [--phases]
//
// Each timing is the median of --reps runs, each after a write of 256 MiB that evicts the L2 cache (cold, as
// when the layer's tensors were written long before), or without it (--warm: as when the previous kernel just
// wrote them). Bandwidth counts the bytes each launcher must move at least: stats reads x; apply reads x (and
// the residual) and writes y; backward reads dy and x (and y) twice, once to reduce and once to apply, and
// writes dx (and the residual's gradient). The forward and the backward are timed twice more, forced into
// one cooperative launch ("1-pass": its second read of the tensors hits L2 when they fit) and as the launchers
// choose on their own (auto); a * marks the layers where auto took the single pass. For the layers with a
// residual (a block's last, whose output the next block uses twice), "bwd 2-dy" is the backward as the launchers
// choose with a second gradient summed in (kernels::batch_norm_relu's twin), which replaces autograd's add of the
// two gradients, an elementwise pass reading two tensors and writing one. Last, the downsampling blocks' two batch
// norms (the block's last and its shortcut's) timed apart and as the dual kernels that run them together, and the
// stem's batch norm + ReLU with its max pooling apart and as the pool kernels.
// --phases: instead, where the forward (auto) runs its single pass, the span of each of its phases across the grid
// from the blocks' clock stamps: the statistics read (the last block's), the first barrier's wait after the last
// block arrived, the finalize, the second barrier, and the apply.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernel_timing.h"
#include "ptrain/kernels/cuda/launch.h"

namespace {

using ptrain::bench::check;
using ptrain::kernels::cuda::Dtype;

// One batch norm of the network: where it sits, its activations [rows, channels], and what follows it.
struct Layer {
  std::string name;
  int64_t rows, channels;
  bool relu, residual;
};

// torchvision's ResNet-50 (stride on the 3x3 convolution): the stem, then per block bn1, bn2, bn3 (+ the
// shortcut's bn in each stage's first block); bn3 adds the shortcut before its ReLU.
std::vector<Layer> resnet50_layers(int64_t batch, int64_t image) {
  std::vector<Layer> layers;
  int64_t side = image / 2;  // after the stem's stride-2 convolution
  layers.push_back({"stem", batch * side * side, 64, true, false});
  side /= 2;  // max pooling
  const int blocks[4] = {3, 4, 6, 3};
  int64_t width = 64;
  for (int stage = 0; stage < 4; ++stage, width *= 2) {
    for (int b = 0; b < blocks[stage]; ++b) {
      const std::string at = "s" + std::to_string(stage + 1) + "." + std::to_string(b);
      const int64_t in_side = side;
      if (b == 0 && stage > 0) side /= 2;
      layers.push_back({at + ".bn1", batch * in_side * in_side, width, true, false});
      layers.push_back({at + ".bn2", batch * side * side, width, true, false});
      if (b == 0) layers.push_back({at + ".shortcut", batch * side * side, width * 4, false, false});
      layers.push_back({at + ".bn3", batch * side * side, width * 4, true, true});
    }
  }
  return layers;
}

int element_bytes(Dtype dtype) { return dtype == Dtype::kFloat ? 4 : 2; }


}  // namespace

int main(int argc, char** argv) {
  // Line-buffered even into a file: a kernel fault aborts the bench, and the rows printed before it must survive.
  setvbuf(stdout, nullptr, _IOLBF, 0);
  int64_t batch = 128, image = 224;
  int reps = 20;
  bool warm = false, phases = false;
  Dtype dtype = Dtype::kBFloat16;
  std::string dtype_name = "bf16";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--batch") batch = std::stoll(value());
    else if (arg == "--image") image = std::stoll(value());
    else if (arg == "--reps") reps = std::stoi(value());
    else if (arg == "--warm") warm = true;
    else if (arg == "--phases") phases = true;
    else if (arg == "--dtype") {
      dtype_name = value();
      if (dtype_name == "bf16") dtype = Dtype::kBFloat16;
      else if (dtype_name == "fp16") dtype = Dtype::kHalf;
      else if (dtype_name == "fp32") dtype = Dtype::kFloat;
      else throw std::runtime_error("--dtype: bf16, fp16 or fp32, not " + dtype_name);
    } else {
      std::fprintf(stderr, "batch_norm_bench: unknown argument %s\n", arg.c_str());
      return 2;
    }
  }
  const std::vector<Layer> layers = resnet50_layers(batch, image);
  int64_t largest = 0;
  for (const Layer& l : layers) largest = std::max(largest, l.rows * l.channels);
  const size_t bytes = static_cast<size_t>(largest) * element_bytes(dtype);
  // Seven activation-sized buffers: x, residual, y, dy, dx, dresidual, dy2; filled with small values of both
  // signs.
  std::vector<void*> buffers(7);
  for (void*& b : buffers) {
    check(cudaMalloc(&b, bytes), "cudaMalloc");
    check(cudaMemset(b, 0x3c, bytes), "cudaMemset");  // 0x3c3c: ~1.1 in fp16, ~0.011 in bf16; fp32 ~0.011
  }
  void *x = buffers[0], *residual = buffers[1], *y = buffers[2], *dy = buffers[3], *dx = buffers[4],
       *dresidual = buffers[5], *dy2 = buffers[6];
  int64_t workspace_floats = 0, max_channels = 0;
  for (const Layer& l : layers) {
    workspace_floats = std::max(workspace_floats, ptrain::kernels::cuda::batch_norm_workspace_floats(l.rows, l.channels));
    max_channels = std::max(max_channels, l.channels);
  }
  float *workspace, *params;
  check(cudaMalloc(&workspace, workspace_floats * sizeof(float)), "cudaMalloc");
  // weight, bias, running mean and variance, mean, invstd, scale and shift (two planes), and the weight and bias
  // gradients (two planes: the launchers take dbias as dweight + channels).
  check(cudaMalloc(&params, 10 * max_channels * sizeof(float)), "cudaMalloc");
  check(cudaMemset(params, 0, 10 * max_channels * sizeof(float)), "cudaMemset");
  float *weight = params, *bias = params + max_channels, *running_mean = params + 2 * max_channels,
        *running_var = params + 3 * max_channels, *mean = params + 4 * max_channels, *invstd = params + 5 * max_channels,
        *scale_shift = params + 6 * max_channels, *dweight = params + 8 * max_channels;
  using ptrain::kernels::cuda::BatchNormShape;
  const ptrain::kernels::cuda::BatchNormSide side{weight, bias,   running_mean, running_var, 0.1,
                                                  1e-5,   mean,   invstd,       scale_shift};
  const ptrain::kernels::cuda::BatchNormGrads grads{dweight, dweight + max_channels};
  std::vector<float> ones(max_channels, 1.0f);
  check(cudaMemcpy(weight, ones.data(), max_channels * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
  cudaStream_t stream;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");
  ptrain::bench::KernelTimer timer(stream, reps, warm);
  const auto time_us = [&](auto&& fn) { return timer.median_us(fn); };
  const auto tbps = [](double moved, double us) { return moved / (us * 1e-6) / 1e12; };

  int device;
  cudaDeviceProp prop;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  const ptrain::bench::MemoryPeak peak = ptrain::bench::memory_peak(device, "batch_norm_bench");
  const double peak_tbps = peak.tbps;
  std::printf("# %s, %d SMs, L2 %d MiB, memory peak %.2f TB/s (%d MHz x %d bits x 2, read off the device); ResNet-50 "
              "batch %lld, %lld px, %s, %s, median of %d\n",
              prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, peak_tbps, peak.clock_khz / 1000, peak.bus_bits,
              static_cast<long long>(batch), static_cast<long long>(image), dtype_name.c_str(), warm ? "warm L2" : "cold L2",
              reps);
  if (phases) {
    // Each layer's single-pass forward once (after one run to warm up, and after the flush unless --warm), and the
    // spans of its phases from the blocks' stamps, in us.
    const int stamps_per_block = ptrain::kernels::cuda::kBatchNormForwardStamps;
    unsigned long long* stamps;
    check(cudaMalloc(&stamps, 512 * stamps_per_block * sizeof(unsigned long long)), "cudaMalloc");
    std::printf("%-14s %8s %5s %7s | %6s %8s %8s %8s %8s %8s %8s | %8s\n", "layer", "rows", "ch", "MiB", "blocks",
                "ramp", "stats", "barrier1", "finalize", "barrier2", "apply", "total");
    double sums[7] = {};
    for (const Layer& l : layers) {
      int64_t blocks = 0;
      bool single = false;
      const auto forward = [&](unsigned long long* into) {
        single = ptrain::kernels::cuda::batch_norm_relu_forward(
            BatchNormShape{dtype, Dtype::kFloat, l.rows, l.channels}, {x, l.residual ? residual : nullptr, l.relu, y},
            side, workspace, stream, {ptrain::kernels::cuda::BatchNormPasses::kAuto, into, &blocks});
      };
      forward(nullptr);
      timer.flush_l2(1);
      forward(stamps);
      check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      if (!single) {
        std::printf("%-14s (split kernels: no single pass to stamp)\n", l.name.c_str());
        continue;
      }
      std::vector<unsigned long long> host(blocks * stamps_per_block);
      check(cudaMemcpy(host.data(), stamps, host.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost), "cudaMemcpy");
      // first[k] and last[k]: the earliest and latest stamp k over the blocks.
      std::vector<unsigned long long> first(stamps_per_block, ~0ull), last(stamps_per_block, 0);
      for (int64_t b = 0; b < blocks; ++b) {
        for (int k = 0; k < stamps_per_block; ++k) {
          first[k] = std::min(first[k], host[b * stamps_per_block + k]);
          last[k] = std::max(last[k], host[b * stamps_per_block + k]);
        }
      }
      const auto us = [](unsigned long long a, unsigned long long b) { return (static_cast<double>(b) - a) / 1000.0; };
      const double span[7] = {us(first[0], last[0]), us(first[0], last[1]), us(last[1], last[2]),
                              us(first[2], last[3]), us(last[3], last[4]), us(first[4], last[5]), us(first[0], last[5])};
      for (int k = 0; k < 7; ++k) sums[k] += span[k];
      std::printf("%-14s %8lld %5lld %7.1f | %6lld %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f | %8.1f\n", l.name.c_str(),
                  static_cast<long long>(l.rows), static_cast<long long>(l.channels),
                  static_cast<double>(l.rows) * l.channels * element_bytes(dtype) / (1 << 20),
                  static_cast<long long>(blocks), span[0], span[1], span[2], span[3], span[4], span[5], span[6]);
    }
    std::printf("%-14s %8s %5s %7s | %6s %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f | %8.1f\n", "total (us)", "", "", "", "",
                sums[0], sums[1], sums[2], sums[3], sums[4], sums[5], sums[6]);
    std::printf("# ramp: first to last block's start; stats: first start to the last block's statistics read; barrier1:"
                " that to the last block's exit; finalize: first exit to the last block's finalize; barrier2 alike;"
                " apply: first exit to the last block's rows applied\n");
    return 0;
  }
  std::printf("%-14s %8s %5s %7s | %8s %6s | %8s %6s | %8s %6s | %8s %6s | %8s %8s | %8s %8s | %8s\n", "layer", "rows",
              "ch", "MiB", "copy us", "TB/s", "stats", "TB/s", "apply", "TB/s", "backward", "TB/s", "fwd 1-p", "fwd auto",
              "bwd 1-p", "bwd auto", "bwd 2-dy");
  double total_copy = 0, total_stats = 0, total_apply = 0, total_backward = 0, total_forward_single = 0,
         total_forward_auto = 0, total_backward_single = 0, total_backward_auto = 0, total_backward_two = 0,
         total_backward_auto_residual = 0, total_copy_residual = 0;
  int residual_layers = 0;
  double copy_bytes = 0, forward_bytes = 0, all_backward_bytes = 0;  // what each must move at least, summed
  using ptrain::kernels::cuda::BatchNormPasses;
  for (const Layer& l : layers) {
    const double tensor = static_cast<double>(l.rows) * l.channels * element_bytes(dtype);
    const BatchNormShape shape{dtype, Dtype::kFloat, l.rows, l.channels};
    const ptrain::kernels::cuda::BatchNormReluForwardIo forward_io{x, l.residual ? residual : nullptr, l.relu, y};
    const double copy = time_us([&] { check(cudaMemcpyAsync(y, x, static_cast<size_t>(tensor), cudaMemcpyDeviceToDevice, stream), "copy"); });
    const double stats = time_us([&] {
      ptrain::kernels::cuda::batch_norm_stats(shape, x, side, workspace, stream);
    });
    const double apply = time_us([&] {
      ptrain::kernels::cuda::batch_norm_relu_apply(shape, forward_io, scale_shift, stream);
    });
    bool took_single = false;
    const auto forward = [&](BatchNormPasses passes) {
      took_single =
          ptrain::kernels::cuda::batch_norm_relu_forward(shape, forward_io, side, workspace, stream, {passes});
    };
    const auto backward_with = [&](BatchNormPasses passes, const void* second_dy = nullptr) {
      took_single = ptrain::kernels::cuda::batch_norm_relu_backward(
          shape, {dy, second_dy, l.residual ? y : nullptr, x, l.relu, dx, l.residual ? dresidual : nullptr}, side,
          grads, workspace, stream, passes);
    };
    const double forward_single = time_us([&] { forward(BatchNormPasses::kSinglePass); });
    const bool forward_single_ran = took_single;
    const double forward_auto = time_us([&] { forward(BatchNormPasses::kAuto); });
    const bool forward_auto_single = took_single;
    const double backward = time_us([&] { backward_with(BatchNormPasses::kSplit); });
    const double backward_single = time_us([&] { backward_with(BatchNormPasses::kSinglePass); });
    const bool backward_single_ran = took_single;
    const double backward_auto = time_us([&] { backward_with(BatchNormPasses::kAuto); });
    const bool backward_auto_single = took_single;
    const double backward_two = l.residual ? time_us([&] { backward_with(BatchNormPasses::kAuto, dy2); }) : 0.0;
    const int loads = l.residual ? 3 : 2;  // dy, x (, y)
    const double apply_bytes = tensor * (l.residual ? 3 : 2);
    const double backward_bytes = tensor * (2 * loads + (l.residual ? 2 : 1));
    char two[16] = "";
    if (l.residual) std::snprintf(two, sizeof(two), "%8.1f", backward_two);
    std::printf("%-14s %8lld %5lld %7.1f | %8.1f %6.2f | %8.1f %6.2f | %8.1f %6.2f | %8.1f %6.2f | %7.1f%s %7.1f%s | "
                "%7.1f%s %7.1f%s | %s\n",
                l.name.c_str(), static_cast<long long>(l.rows), static_cast<long long>(l.channels), tensor / (1 << 20),
                copy, tbps(2 * tensor, copy), stats, tbps(tensor, stats), apply, tbps(apply_bytes, apply), backward,
                tbps(backward_bytes, backward), forward_single, forward_single_ran ? " " : "!", forward_auto,
                forward_auto_single ? "*" : " ", backward_single, backward_single_ran ? " " : "!", backward_auto,
                backward_auto_single ? "*" : " ", two);
    total_copy += copy, total_stats += stats, total_apply += apply, total_backward += backward;
    copy_bytes += 2 * tensor, forward_bytes += tensor + apply_bytes, all_backward_bytes += backward_bytes;
    total_forward_single += forward_single, total_forward_auto += forward_auto;
    total_backward_single += backward_single, total_backward_auto += backward_auto;
    if (l.residual) {
      ++residual_layers;
      total_backward_two += backward_two, total_backward_auto_residual += backward_auto, total_copy_residual += copy;
    }
  }
  std::printf("%-14s %8s %5s %7s | %8.1f %6s | %8.1f %6s | %8.1f %6s | %8.1f %6s | %7.1f  %7.1f  | %7.1f  %7.1f\n",
              "total (us)", "", "", "", total_copy, "", total_stats, "", total_apply, "", total_backward, "",
              total_forward_single, total_forward_auto, total_backward_single, total_backward_auto);
  std::printf("# forward split (stats + apply) %.1f us; ! marks a layer the single pass could not take (split ran)\n",
              total_stats + total_apply);
  // Against the memory's peak: the bytes each must move at least (stats' read of x counted in the forward, both
  // reads of the backward's inputs), over the 53 layers' summed time.
  std::printf("# of the %.2f TB/s peak: copy %.2f TB/s (%.0f%%), forward auto %.2f TB/s (%.0f%%), backward auto "
              "%.2f TB/s (%.0f%%)\n",
              peak_tbps, tbps(copy_bytes, total_copy), 100 * tbps(copy_bytes, total_copy) / peak_tbps,
              tbps(forward_bytes, total_forward_auto), 100 * tbps(forward_bytes, total_forward_auto) / peak_tbps,
              tbps(all_backward_bytes, total_backward_auto), 100 * tbps(all_backward_bytes, total_backward_auto) / peak_tbps);
  std::printf("# the %d layers with a residual: backward auto %.1f us, with a second gradient %.1f us; their copies "
              "(one tensor read, one written) %.1f us, where autograd's add of two gradients reads two\n",
              residual_layers, total_backward_auto_residual, total_backward_two, total_copy_residual);

  // The downsampling blocks' last batch norm with their shortcut's: as two batch norms (the shortcut's output
  // written, then read as the residual; its gradient written by the backward, then read by the shortcut's), and as
  // the dual kernels (kernels::batch_norm_add_batch_norm_relu), both with a second gradient (a twin) backward.
  float* params2;
  check(cudaMalloc(&params2, 9 * max_channels * sizeof(float)), "cudaMalloc");
  check(cudaMemset(params2, 0, 9 * max_channels * sizeof(float)), "cudaMemset");
  check(cudaMemcpy(params2, ones.data(), max_channels * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
  int64_t dual_workspace_floats = 0;
  for (const Layer& l : layers)
    dual_workspace_floats =
        std::max(dual_workspace_floats, ptrain::kernels::cuda::dual_batch_norm_workspace_floats(l.rows, l.channels));
  float* dual_workspace;
  check(cudaMalloc(&dual_workspace, dual_workspace_floats * sizeof(float)), "cudaMalloc");
  const auto side_at = [&](float* base) {
    return ptrain::kernels::cuda::BatchNormSide{base, base + max_channels, base + 2 * max_channels,
                                                base + 3 * max_channels, 0.1, 1e-5, base + 4 * max_channels,
                                                base + 5 * max_channels, base + 6 * max_channels};
  };
  std::printf("\n%-14s %8s %5s | %10s %10s | %10s %10s | %6s\n", "shortcut pair", "rows", "ch", "fwd apart", "fwd dual",
              "bwd apart", "bwd dual", "dual");
  double apart_total = 0, dual_total = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    const Layer& l = layers[i];
    if (l.name.find(".shortcut") == std::string::npos) continue;
    const Layer& last = layers[i + 1];  // the block's bn3, whose residual the shortcut's output was
    const BatchNormShape shape{dtype, Dtype::kFloat, l.rows, l.channels};
    const BatchNormShape last_shape{dtype, Dtype::kFloat, last.rows, last.channels};
    void* x2 = residual;  // the shortcut convolution's output
    void* y2 = dresidual;  // apart: the shortcut's output; dual: the shortcut's gradient
    const double forward_apart = time_us([&] {
      ptrain::kernels::cuda::batch_norm_relu_forward(shape, {x2, nullptr, false, y2}, side_at(params2), workspace,
                                                     stream);
      ptrain::kernels::cuda::batch_norm_relu_forward(last_shape, {x, y2, true, y}, side, workspace, stream);
    });
    bool ran = false;
    const double forward_dual = time_us([&] {
      ran = ptrain::kernels::cuda::batch_norm_add_batch_norm_relu_forward(shape, x, x2, side_at(params),
                                                                          side_at(params2), y, dual_workspace, stream);
    });
    const bool forward_ran = ran;
    const double backward_apart = time_us([&] {
      ptrain::kernels::cuda::batch_norm_relu_backward(last_shape, {dy, dy2, y, x, true, dx, y2}, side, grads,
                                                      workspace, stream);
      ptrain::kernels::cuda::batch_norm_relu_backward(shape, {y2, nullptr, nullptr, x2, false, dx, nullptr},
                                                      side_at(params2), {params2 + 8 * max_channels, nullptr},
                                                      workspace, stream);
    });
    const double backward_dual = time_us([&] {
      ran = ptrain::kernels::cuda::batch_norm_add_batch_norm_relu_backward(
          shape, {dy, dy2, y, x, x2, dx, y2}, side_at(params), side_at(params2), grads,
          {params2 + 8 * max_channels, nullptr}, dual_workspace, stream);
    });
    std::printf("%-14s %8lld %5lld | %10.1f %10.1f | %10.1f %10.1f | %6s\n", l.name.c_str(),
                static_cast<long long>(l.rows), static_cast<long long>(l.channels), forward_apart, forward_dual,
                backward_apart, backward_dual, forward_ran && ran ? "yes" : "NO");
    apart_total += forward_apart + backward_apart;
    dual_total += forward_dual + backward_dual;
  }
  std::printf("# shortcut pairs, forward + backward: apart %.1f us, dual %.1f us\n", apart_total, dual_total);

  // The stem's batch norm + ReLU and its 3x3 stride-2 max pooling: apart (the batch norm's output written and read
  // by the pooling; backward, the pooling's input gradient written and read by the batch norm) and as the pool
  // kernels (kernels::batch_norm_relu_max_pool).
  const Layer& stem = layers[0];
  const BatchNormShape stem_shape{dtype, Dtype::kFloat, stem.rows, stem.channels};
  const int64_t side_in = image / 2, side_out = (side_in + 2 - 3) / 2 + 1;
  const ptrain::kernels::cuda::PoolShape pool{batch, stem.channels, side_in, side_in, side_out, side_out, 3, 2, 1};
  uint8_t* positions;
  check(cudaMalloc(&positions, static_cast<size_t>(batch * side_out * side_out * stem.channels)), "cudaMalloc");
  void* pooled = residual;  // apart and fused: the pooled output
  const double stem_forward_apart = time_us([&] {
    ptrain::kernels::cuda::batch_norm_relu_forward(stem_shape, {x, nullptr, true, y}, side, workspace, stream);
    ptrain::kernels::cuda::max_pool_forward(dtype, y, pool, pooled, positions, stream);
  });
  bool stem_ran = false;
  const double stem_forward_fused = time_us([&] {
    stem_ran = ptrain::kernels::cuda::batch_norm_relu_max_pool_forward(
        dtype, Dtype::kFloat, pool, {x, pooled, positions}, side_at(params), workspace, stream);
  });
  const bool stem_forward_ran = stem_ran;
  const double stem_backward_apart = time_us([&] {
    ptrain::kernels::cuda::max_pool_backward(dtype, dy, positions, pool, dresidual, stream);
    ptrain::kernels::cuda::batch_norm_relu_backward(stem_shape, {dresidual, nullptr, nullptr, x, true, dx, nullptr},
                                                    side, grads, workspace, stream);
  });
  const double stem_backward_fused = time_us([&] {
    stem_ran = ptrain::kernels::cuda::batch_norm_relu_max_pool_backward(
        dtype, Dtype::kFloat, pool, {dy, positions, x, dx}, side_at(params), {dweight, dweight + max_channels},
        workspace, stream);
  });
  std::printf("\n%-14s | %10s %10s | %10s %10s | %6s\n", "stem + pool", "fwd apart", "fwd fused", "bwd apart",
              "bwd fused", "fused");
  std::printf("%-14s | %10.1f %10.1f | %10.1f %10.1f | %6s\n", "stem", stem_forward_apart, stem_forward_fused,
              stem_backward_apart, stem_backward_fused, stem_forward_ran && stem_ran ? "yes" : "NO");
  return 0;
}
