// Random images with a learnable label, for speed runs that should not wait on decoding or disk.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "ptrain/data/dataset.h"

namespace ptrain::data {

// n images (channels x height x width) over `classes` balanced classes. Pixel = class level + uniform noise,
// the level of class c being round(255 * (c + 0.5) / classes) with integer noise of +-(0.75 of that spacing + 32), clamped to
// 0..255: a single pixel says little, but the image mean tells the class apart, so a network can learn it.
// Deterministic in seed.
Dataset make_synthetic(int64_t n, int64_t channels, int64_t height, int64_t width, int64_t classes, uint64_t seed);

// One field of a synthetic dataset's spec ("50000:3x32x32:10", "20000:64:256"): a positive integer
// written whole, or nullopt.
std::optional<int64_t> positive_field(const std::string& text);

}  // namespace ptrain::data
