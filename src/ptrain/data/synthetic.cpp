#include "ptrain/data/synthetic.h"

#include <ATen/CPUGeneratorImpl.h>

#include "ptrain/core/error.h"

namespace ptrain::data {

Dataset make_synthetic(int64_t n, int64_t channels, int64_t height, int64_t width, int64_t classes, uint64_t seed) {
  check(n > 0 && channels > 0 && height > 0 && width > 0,
        "synthetic dataset: sizes must be positive, got n=" + std::to_string(n) + " " + std::to_string(channels) +
            "x" + std::to_string(height) + "x" + std::to_string(width));
  check(classes >= 1 && classes <= 256, "synthetic dataset: classes must be 1..256, got " + std::to_string(classes));
  auto gen = at::detail::createCPUGenerator(seed);

  // Balanced classes in random order.
  auto labels = torch::arange(n, torch::kInt64).remainder(classes).index_select(0, torch::randperm(n, gen, torch::kInt64));
  const double spacing = 255.0 / static_cast<double>(classes);
  const auto amplitude = static_cast<int64_t>(0.75 * spacing + 32.0);
  auto level = ((labels.to(torch::kFloat) + 0.5) * spacing).round().to(torch::kShort);
  auto images = torch::empty({n, channels, height, width}, torch::kUInt8);
  // In chunks, so that the int16 intermediate stays small next to the uint8 result.
  constexpr int64_t kChunk = 4096;
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t count = std::min(kChunk, n - start);
    auto noise = torch::randint(-amplitude, amplitude + 1, {count, channels, height, width}, gen, torch::kShort);
    images.narrow(0, start, count)
        .copy_((level.narrow(0, start, count).view({count, 1, 1, 1}) + noise).clamp(0, 255).to(torch::kUInt8));
  }

  Dataset ds;
  ds.images = images;
  ds.labels = labels;
  for (int64_t c = 0; c < classes; ++c) ds.classes.push_back("class" + std::to_string(c));
  ds.description = "synthetic (" + std::to_string(n) + " images " + std::to_string(channels) + "x" +
                   std::to_string(height) + "x" + std::to_string(width) + ", " + std::to_string(classes) +
                   " classes, seed " + std::to_string(seed) + ")";
  return ds;
}

std::optional<int64_t> positive_field(const std::string& text) {
  size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used != text.size() || text.empty() || value <= 0) return std::nullopt;
  return value;
}

}  // namespace ptrain::data
