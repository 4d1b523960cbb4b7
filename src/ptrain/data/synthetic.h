// Random images with a learnable label, for speed runs that should not wait on decoding or disk.
#pragma once

#include <cstdint>

#include "ptrain/data/dataset.h"

namespace ptrain::data {

// n images (channels x height x width) over `classes` balanced classes. Pixel = class level + uniform noise,
// the level of class c being round(255 * (c + 0.5) / classes) with integer noise of +-(0.75 of that spacing + 32), clamped to
// 0..255: a single pixel says little, but the image mean tells the class apart, so a network can learn it.
// Deterministic in seed.
Dataset make_synthetic(int64_t n, int64_t channels, int64_t height, int64_t width, int64_t classes, uint64_t seed);

}  // namespace ptrain::data
