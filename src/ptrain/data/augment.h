// Batch augmentation and normalisation on the batch's own device: the loader ships uint8 images and the GPU
// does the rest, so the host never becomes the bottleneck of a fast accelerator.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace ptrain::data {

struct AugmentOptions {
  bool random_crop = false;  // zero-pad by crop_padding, then crop back to the original size at a random offset
  int64_t crop_padding = 4;
  bool horizontal_flip = false;  // each sample flipped with probability 1/2
  // 0 keeps the size; else the shorter side becomes `resize` and the longer one int(resize * long / short), as
  // torchvision's Resize(int). Bilinear, align_corners=false, without antialiasing, both ways: for upsampling
  // antialiasing makes no difference, for downsampling this equals torchvision's tensor Resize(antialias=False)
  // (its default in 0.14), not PIL's filtered downscale.
  int64_t resize = 0;
  std::vector<float> mean, std;  // one value per channel, or a single value for all; empty: no normalisation
  c10::ScalarType out_dtype = torch::kFloat;
  bool channels_last = false;
};

// The random choices for one batch, drawn on the CPU so that a run gives the same augmentation on any device.
struct AugmentDraw {
  torch::Tensor crop_dy, crop_dx;  // int64 [B] in [0, 2 * crop_padding]; padding means no shift
  torch::Tensor flip;              // bool [B]
};

// Draws crop offsets and flips for `batch` samples from a CPU generator seeded with `seed`. Both are always
// drawn, whatever the options enable, so the random stream does not depend on them.
AugmentDraw draw_augmentation(int64_t batch, const AugmentOptions& options, uint64_t seed);

// images_u8: uint8 B x C x H x W on any device. Applies, in this order, the random crop and flip
// (only those the options enable, and only with a draw: nullptr is evaluation), conversion to float / 255,
// resize, normalisation, the cast to out_dtype and the optional channels-last layout. Returns a tensor on the
// same device.
torch::Tensor augment_batch(const torch::Tensor& images_u8, const AugmentOptions& options, const AugmentDraw* draw);

}  // namespace ptrain::data
