#include "ptrain/data/augment.h"

#include <ATen/CPUGeneratorImpl.h>

#include "ptrain/core/error.h"

namespace ptrain::data {

namespace {

// Host tensors for the device's kernels go through pinned memory without blocking: a pageable copy makes the
// host wait until the device's queue reaches it, so the host could never run ahead of the training step
// (measured on an H200: 1 ms of idle GPU a ResNet-50 step between CUDA graph replays).
torch::Tensor to_device(const torch::Tensor& host, const torch::Device& device) {
  if (!device.is_cuda()) return host.to(device);
  return host.pin_memory().to(device, /*non_blocking=*/true);
}

torch::Tensor channel_vector(const std::vector<float>& values, int64_t channels, const torch::Tensor& like,
                             const char* what) {
  check(values.size() == 1 || static_cast<int64_t>(values.size()) == channels,
        std::string("augment: ") + what + " has " + std::to_string(values.size()) + " values for " +
            std::to_string(channels) + " channels");
  return to_device(torch::tensor(values, torch::kFloat), like.device()).view({1, -1, 1, 1});
}

// Pad, crop and flip in one gather over the flattened padded image: output pixel (y, x) of sample b reads padded
// pixel (dy_b + y, dx_b + x'), x' = W - 1 - x when b is flipped. Done on uint8, where it is exact and moves 4x
// fewer bytes than on float.
torch::Tensor crop_and_flip(const torch::Tensor& images, const AugmentOptions& options, const AugmentDraw& draw) {
  const int64_t batch = images.size(0), channels = images.size(1), height = images.size(2), width = images.size(3);
  const auto device = images.device();
  const auto index_options = torch::TensorOptions().dtype(torch::kInt64).device(device);
  const int64_t pad = options.random_crop ? options.crop_padding : 0;
  torch::Tensor source = images;
  torch::Tensor dy = torch::zeros({batch}, index_options), dx = torch::zeros({batch}, index_options);
  if (options.random_crop) {
    check(pad >= 0, "augment: crop_padding must be >= 0, got " + std::to_string(pad));
    check(draw.crop_dy.numel() == batch && draw.crop_dx.numel() == batch,
          "augment: crop draws are for " + std::to_string(draw.crop_dy.numel()) + " samples, the batch has " +
              std::to_string(batch));
    source = torch::constant_pad_nd(images, {pad, pad, pad, pad}, 0);
    dy = to_device(draw.crop_dy, device);
    dx = to_device(draw.crop_dx, device);
  }
  const int64_t padded_width = width + 2 * pad;
  auto xs = torch::arange(width, index_options).view({1, width});
  if (options.horizontal_flip) {
    check(draw.flip.numel() == batch, "augment: flip draws are for " + std::to_string(draw.flip.numel()) +
                                          " samples, the batch has " + std::to_string(batch));
    xs = torch::where(to_device(draw.flip, device).view({batch, 1}), (width - 1) - xs, xs);
  }
  auto rows = dy.view({batch, 1}) + torch::arange(height, index_options).view({1, height});  // B x H
  auto cols = dx.view({batch, 1}) + xs;                                                        // B x W
  auto flat_index = (rows.view({batch, height, 1}) * padded_width + cols.view({batch, 1, width})).view({batch, 1, -1});
  return source.reshape({batch, channels, -1})
      .gather(2, flat_index.expand({batch, channels, height * width}))
      .view({batch, channels, height, width});
}

}  // namespace

AugmentDraw draw_augmentation(int64_t batch, const AugmentOptions& options, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  const int64_t span = 2 * std::max<int64_t>(options.crop_padding, 0) + 1;
  AugmentDraw draw;
  draw.crop_dy = torch::randint(0, span, {batch}, gen, torch::kInt64);
  draw.crop_dx = torch::randint(0, span, {batch}, gen, torch::kInt64);
  draw.flip = torch::randint(0, 2, {batch}, gen, torch::kInt64).to(torch::kBool);
  return draw;
}

torch::Tensor augment_batch(const torch::Tensor& images_u8, const AugmentOptions& options, const AugmentDraw* draw) {
  check(images_u8.dim() == 4, "augment: images must be B x C x H x W, got " + std::to_string(images_u8.dim()) +
                                  " dimensions");
  check(images_u8.scalar_type() == torch::kUInt8, "augment: images must be uint8");
  torch::Tensor x = images_u8;
  if (draw != nullptr && (options.random_crop || options.horizontal_flip)) x = crop_and_flip(x, options, *draw);
  x = x.to(torch::kFloat).div_(255.0f);
  // Scaling and normalising are affine per channel, and bilinear interpolation's weights sum to one, so they run
  // before the resize, on the small images, with the same values up to float rounding: after it they were three
  // passes over the resized batch (CIFAR-10 at 224 px, batch 128: 77 MB each, 0.19 ms of an H200's step). The
  // images go channels-last first where asked, so that the resize's NHWC kernel writes them in that layout (its
  // NCHW kernel took 0.15 ms, with as many blocks as output pixels / 1024).
  if (!options.mean.empty() || !options.std.empty()) {
    const int64_t channels = x.size(1);
    x = x.sub_(channel_vector(options.mean, channels, x, "mean")).div_(channel_vector(options.std, channels, x, "std"));
  }
  if (options.channels_last) x = x.contiguous(torch::MemoryFormat::ChannelsLast);

  if (options.resize > 0) {
    const int64_t height = x.size(2), width = x.size(3);
    const int64_t shorter = std::min(height, width), longer = std::max(height, width);
    const auto other = static_cast<int64_t>(static_cast<double>(options.resize) * longer / shorter);
    const int64_t out_h = height <= width ? options.resize : other;
    const int64_t out_w = height <= width ? other : options.resize;
    if (out_h != height || out_w != width) {
      x = torch::nn::functional::interpolate(x, torch::nn::functional::InterpolateFuncOptions()
                                                    .size(std::vector<int64_t>{out_h, out_w})
                                                    .mode(torch::kBilinear)
                                                    .align_corners(false));
    }
  }

  if (options.out_dtype != torch::kFloat) x = x.to(options.out_dtype);
  if (options.channels_last) x = x.contiguous(torch::MemoryFormat::ChannelsLast);
  return x;
}

}  // namespace ptrain::data
