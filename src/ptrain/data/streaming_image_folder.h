// Image folders of any size: the folder is listed (as load_image_folder lists it: classes, files, labels)
// and nothing else is read until the loader asks for a batch; its workers then decode each image for the
// crop it will be cut to (jpeg_decode.h) and resample the crop to the output size. Host memory holds the
// file list and the batches in flight, whatever the folder's size, and images may have any size and
// aspect ratio.
//
// Training crops are ImageNet's (torchvision's RandomResizedCrop(size, scale=(0.08, 1), ratio=(3/4, 4/3))
// and RandomHorizontalFlip), drawn per sample from a seed the loader derives from (run seed, epoch,
// sample), so a run is the same on any number of threads. Evaluation resizes the shorter side to
// size / 0.875 and takes the centre size x size (Resize(256) + CenterCrop(224) at 224).
#pragma once

#include <cstdint>
#include <string>

#include "ptrain/data/dataset.h"

namespace ptrain::data {

struct StreamingOptions {
  int64_t image_size = 224;  // side of the square crops
  int threads = 2;           // decode workers of the loader
  double eval_crop_fraction = 0.875;  // evaluation: the centre crop's share of the resized shorter side
};

Dataset open_streaming_image_folder(const std::string& root, const StreamingOptions& options);

// --image-loading auto for the folder training reads (root/train): "stream" when its image files take more
// than kAutoStreamBytes on disk or the images sampled from it differ in size (the in-memory path needs one
// size), else "memory".
constexpr int64_t kAutoStreamBytes = int64_t{1} << 30;
std::string choose_image_loading(const std::string& train_root);

}  // namespace ptrain::data
