// Times ptrain's GPT-block kernels (src/ptrain/kernels/cuda/layer_norm.cu, linear.cu on column_sums.cuh) at the
// shapes of a GPT-2 training step, beside a device-to-device copy of the same bytes: how far each is from the
// memory system, at each model size. The step's trace sums kernels over the whole network; this says which of these
// passes make up those sums.
//
//   gpt_block_bench [--rows 8192] [--reps 20] [--warm] [--widths 768,1280,1600]
//
// rows: tokens a step (batch x sequence); widths: the models' (GPT-2 small, large, XL). Each timing is the median of
// --reps runs, each after a write of 256 MiB that evicts the L2 cache (cold), or without it (--warm). Bandwidth counts
// the bytes each launcher must move at least, pass by pass:
// - ln fwd: the add + LayerNorm forward with a bf16 branch (every GPT LayerNorm but the first): reads x (fp32) and
//   the branch, writes the sum (fp32) and the normalised rows (bf16).
// - ln bwd: its backward with the sum's gradient from a later use: the rows pass reads dy (bf16), the sum and
//   grad_sum (fp32), writes dx (fp32) and the branch's gradient (bf16); the weight and bias pass reads dy and the
//   sum again.
// - bias C: a linear layer's bias gradient over C columns (bf16): reads the gradient once.
// - gelu+bias 4W: GELU's backward with the MLP's c_fc bias gradient: reads the gradient and GELU's input, writes the
//   gradient of GELU's input.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernel_timing.h"
#include "ptrain/kernels/cuda/launch.h"

namespace {

namespace cuda = ptrain::kernels::cuda;
using ptrain::bench::check;

void* device_buffer(size_t bytes) {
  void* p = nullptr;
  check(cudaMalloc(&p, bytes), "cudaMalloc");
  check(cudaMemset(p, 0x3c, bytes), "cudaMemset");  // 0x3c3c: ~0.011 in bf16; fp32 ~0.011
  return p;
}

std::vector<int64_t> parse_list(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) out.push_back(std::stoll(item));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  int64_t rows = 8192;
  int reps = 20;
  bool warm = false;
  std::vector<int64_t> widths = {768, 1280, 1600};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--rows") rows = std::stoll(value());
    else if (arg == "--reps") reps = std::stoi(value());
    else if (arg == "--warm") warm = true;
    else if (arg == "--widths") widths = parse_list(value());
    else {
      std::fprintf(stderr, "gpt_block_bench: unknown argument %s\n", arg.c_str());
      return 2;
    }
  }
  const int64_t widest = *std::max_element(widths.begin(), widths.end());
  // Activation buffers of the widest layer's 4W columns in fp32: x, branch, sum, out, dy, grad_sum, dx, dbranch.
  const size_t big = static_cast<size_t>(rows) * 4 * widest * sizeof(float);
  void *a = device_buffer(big), *b = device_buffer(big), *c = device_buffer(big), *d = device_buffer(big);
  void *e = device_buffer(big), *f = device_buffer(big), *g = device_buffer(big), *h = device_buffer(big);
  float* per_row = static_cast<float*>(device_buffer(2 * rows * sizeof(float)));  // mean, rstd
  float* params = static_cast<float*>(device_buffer(8 * 4 * widest * sizeof(float)));
  const int64_t workspace_floats =
      std::max(cuda::layer_norm_workspace_floats(rows, widest), cuda::bias_gradient_workspace_floats(rows, 4 * widest));
  float* workspace = static_cast<float*>(device_buffer(workspace_floats * sizeof(float)));
  cudaStream_t stream;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");
  ptrain::bench::KernelTimer timer(stream, reps, warm);
  const auto time_us = [&](auto&& fn) { return timer.median_us(fn); };
  const auto tbps = [](double bytes, double us) { return bytes / (us * 1e-6) / 1e12; };

  int device;
  cudaDeviceProp prop;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  const double peak_tbps = ptrain::bench::memory_peak(device, "gpt_block_bench").tbps;
  std::printf("# %s, %d SMs, L2 %d MiB, memory peak %.2f TB/s (read off the device); %lld rows, %s, median of %d\n",
              prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, peak_tbps, static_cast<long long>(rows),
              warm ? "warm L2" : "cold L2", reps);
  std::printf("%-16s %6s %9s %9s %7s %7s | %9s %7s\n", "kernel", "width", "MB", "us", "TB/s", "% peak", "copy us",
              "copy %");
  const auto row = [&](const char* name, int64_t width, double bytes, double us) {
    // A copy moves its bytes twice (read and write): the same traffic is a copy of half of them.
    const size_t copy_bytes = static_cast<size_t>(bytes / 2);
    const double copy_us = time_us([&] { check(cudaMemcpyAsync(a, b, copy_bytes, cudaMemcpyDeviceToDevice, stream), "copy"); });
    std::printf("%-16s %6lld %9.1f %9.1f %7.2f %7.1f | %9.1f %7.1f\n", name, static_cast<long long>(width), bytes / 1e6,
                us, tbps(bytes, us), peak_tbps > 0 ? 100.0 * tbps(bytes, us) / peak_tbps : 0.0, copy_us,
                peak_tbps > 0 ? 100.0 * tbps(bytes, copy_us) / peak_tbps : 0.0);
  };
  for (const int64_t w : widths) {
    const double n = static_cast<double>(rows) * w;
    const cuda::LayerNormShape ln{cuda::Dtype::kBFloat16, cuda::Dtype::kBFloat16, rows, w};
    float* weight = params;
    float* bias = params + w;
    const double fwd = time_us([&] {
      cuda::add_layer_norm_forward(ln, {static_cast<float*>(a), b, static_cast<float*>(c), d, per_row, per_row + rows},
                                   weight, bias, 1e-5, stream);
    });
    row("ln fwd", w, n * (4 + 2 + 4 + 2), fwd);
    const double bwd = time_us([&] {
      cuda::add_layer_norm_backward(ln, {e, static_cast<float*>(f), static_cast<float*>(c), per_row, per_row + rows,
                                         static_cast<float*>(g), h},
                                    weight, params + 2 * w, params + 3 * w, workspace, stream);
    });
    row("ln bwd", w, n * ((2 + 4 + 4 + 4 + 2) + (2 + 4)), bwd);
    for (const int64_t cols : {w, 3 * w, 4 * w}) {
      const cuda::BiasGradientShape shape{cuda::Dtype::kBFloat16, cuda::Dtype::kBFloat16, rows, cols};
      const double us = time_us([&] { cuda::bias_gradient(shape, e, params, workspace, stream); });
      row(cols == w ? "bias W" : cols == 3 * w ? "bias 3W" : "bias 4W", w, static_cast<double>(rows) * cols * 2, us);
    }
    const cuda::BiasGradientShape mlp{cuda::Dtype::kBFloat16, cuda::Dtype::kBFloat16, rows, 4 * w};
    const double gelu = time_us([&] { cuda::gelu_backward_bias_gradient(mlp, {e, a, g}, params, workspace, stream); });
    row("gelu+bias 4W", w, static_cast<double>(rows) * 4 * w * 2 * 3, gelu);
  }
  return 0;
}
