#include "ptrain/metrics/flops.h"

#include <array>
#include <cstdio>

namespace ptrain::metrics {

namespace {

// Dense TFLOP/s from the vendors' datasheets (the sparse figures halved where only those are printed), in
// MathRate's order; 0 where the GPU has no such rate. A name matches the first row whose every part it contains,
// so the NVL and PCIe boards come before the SXM board whose names they extend.
struct DatasheetRow {
  std::array<const char*, 2> parts;  // nullptr: no second part
  const char* board;
  std::array<double, 4> tflops;
};

constexpr DatasheetRow kDatasheets[] = {
    {{"H100", "NVL"}, "H100 NVL", {60.0, 417.5, 835.5, 1670.5}},
    {{"H100", "PCIe"}, "H100 PCIe", {51.2, 378.0, 756.0, 1513.0}},
    {{"H100", nullptr}, "H100 SXM5", {66.9, 494.7, 989.4, 1978.9}},
    {{"H200", "NVL"}, "H200 NVL", {60.0, 417.5, 835.5, 1670.5}},
    {{"H200", nullptr}, "H200 SXM", {66.9, 494.7, 989.4, 1978.9}},
    {{"A100", nullptr}, "A100", {19.5, 156.0, 312.0, 0.0}},
    {{"L40S", nullptr}, "L40S", {91.6, 183.0, 362.05, 733.0}},
    {{"L4", nullptr}, "L4", {30.3, 60.0, 121.0, 242.5}},
};

bool contains(const std::string& text, const char* part) { return part == nullptr || text.find(part) != std::string::npos; }

// "L4" must not match "L40S" (nor "H100" an imagined "H1000"): the part ends the name or a word of it.
bool contains_word(const std::string& text, const char* part) {
  if (part == nullptr) return true;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) {
    const size_t end = at + std::string(part).size();
    if (end == text.size() || text[end] == ' ' || text[end] == '-') return true;
  }
  return false;
}

// Dense FLOPs a multiprocessor does each clock, by architecture, in MathRate's order (0: no such rate): the rates
// behind the datasheets (an A100's 312 TFLOP/s bf16 are 108 SMs x 1410 MHz x 2048; an H100 SXM's 989 are 132 x
// 1830 x 4096).
std::array<double, 4> per_clock_and_multiprocessor(int compute_capability) {
  switch (compute_capability) {
    case 80: return {128, 1024, 2048, 0};
    case 86:
    case 87: return {256, 512, 1024, 0};
    case 89: return {256, 512, 1024, 2048};
    case 90: return {256, 2048, 4096, 8192};
    default: return {0, 0, 0, 0};
  }
}

}  // namespace

std::string math_rate_name(MathRate rate) {
  switch (rate) {
    case MathRate::kFp32: return "dense fp32";
    case MathRate::kTf32: return "dense tf32";
    case MathRate::kHalf: return "dense bf16/fp16";
    case MathRate::kFp8: return "dense fp8";
  }
  return "dense";
}

std::optional<DensePeak> dense_peak(const cuda_runtime::DeviceProperties& gpu, MathRate rate) {
  const auto index = static_cast<size_t>(rate);
  for (const auto& row : kDatasheets) {
    if (!contains_word(gpu.name, row.parts[0]) || !contains(gpu.name, row.parts[1])) continue;
    if (row.tflops[index] <= 0) return std::nullopt;
    return DensePeak{row.tflops[index] * 1e12, std::string(row.board) + " datasheet, " + math_rate_name(rate)};
  }
  const double per_clock = per_clock_and_multiprocessor(gpu.compute_capability)[index];
  if (per_clock <= 0 || gpu.multiprocessors <= 0 || gpu.max_clock_khz <= 0) return std::nullopt;
  char basis[160];
  std::snprintf(basis, sizeof(basis), "derived: %d SMs x %d MHz x %.0f FLOP a clock (compute capability %d.%d), %s",
                gpu.multiprocessors, gpu.max_clock_khz / 1000, per_clock, gpu.compute_capability / 10,
                gpu.compute_capability % 10, math_rate_name(rate).c_str());
  return DensePeak{gpu.multiprocessors * (gpu.max_clock_khz * 1e3) * per_clock, basis};
}

FlopUtilisation flop_utilisation(double forward_flops_per_sample, int64_t samples_per_step, double samples_per_second,
                                 int64_t devices, const std::optional<DensePeak>& peak) {
  FlopUtilisation u;
  u.model_flops_per_step = 3.0 * forward_flops_per_sample * static_cast<double>(samples_per_step);
  const double per_device = 3.0 * forward_flops_per_sample * samples_per_second / static_cast<double>(devices > 0 ? devices : 1);
  u.tflops = per_device / 1e12;
  if (peak && peak->flops_per_second > 0) u.mfu = per_device / peak->flops_per_second;
  return u;
}

}  // namespace ptrain::metrics
