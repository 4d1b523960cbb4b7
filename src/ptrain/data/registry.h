// Datasets by name, as the configuration and the command line name them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ptrain/data/dataset.h"

namespace ptrain::data {

struct DataSpec {
  std::string name;
  std::string path;  // empty: the dataset's default, where it has one
  int64_t seq_len = 0;  // token datasets: tokens per sample; 0: the dataset's default
  // Image folders (imagefolder, cifar10 as a folder): memory (decoded once), stream (decoded per batch at
  // image_size, streaming_image_folder.h) or auto (streaming_image_folder.h's choose_image_loading).
  std::string image_loading = "auto";
  int64_t image_size = 0;
};

// Known names:
//   fashion-mnist  IDX files under path (default /usr/share/datasets/fashion-mnist, Debian's dataset-fashion-mnist)
//   mnist          IDX files under path (no default)
//   cifar10        path holds the binary release (data_batch_*.bin / test_batch.bin, directly or inside
//                  cifar-10-batches-bin/) or an image folder with train/ and test/; detected in that order
//   imagefolder    path/train and path/test, each laid out as torchvision's ImageFolder
//   synthetic      path "N:CxHxW:classes", e.g. "50000:3x32x32:10" (the default when empty); the test split is
//                  N / 5 images from another seed
//   synthetic-tokens  path "N:T:V", e.g. "20000:64:256" (the default when empty): N sequences of T tokens below V
//                  from a fixed random Markov chain (data/tokens.h); seq_len, when set, replaces T
//   text           path is a UTF-8 text file read as bytes (vocabulary 256) in windows of seq_len + 1 bytes
//                  (default 256); the last 10% of the file is the test split
// threads is the number of decoding threads for image folders (loading them whole, or streaming).
Dataset open_dataset(const DataSpec& spec, bool train, int threads);

// The spec with image_loading "auto" decided (for image folders, from the training folder), so that
// both splits are opened the same way without deciding twice.
DataSpec resolve_image_loading(DataSpec spec);

// The names open_dataset knows.
std::vector<std::string> dataset_names();

// The datasets of tokens (synthetic-tokens, text), which language models train on; the others hold images.
bool is_token_dataset(const std::string& name);

// Per-channel mean and standard deviation of the training split's pixels in [0, 1] (the usual published values),
// for AugmentOptions. One value stands for all channels.
struct Normalization {
  std::vector<float> mean, std;
};

// cifar10: 0.4914,0.4822,0.4465 / 0.2470,0.2435,0.2616; fashion-mnist 0.2860 / 0.3530; mnist 0.1307 / 0.3081;
// anything else 0.5 / 0.5.
Normalization default_normalization(const std::string& name);

// --normalize: "MEAN,STD" (one value for every channel, e.g. 0.5,0.5), "MEANS/STDS" per channel (e.g.
// 0.485,0.456,0.406/0.229,0.224,0.225) or "none" (pixels in [0, 1], as mean 0 and std 1). Throws ptrain::Error
// naming --normalize for anything else: a value that is no finite float, a standard deviation <= 0 or above 1e30,
// means and standard deviations of different counts.
Normalization parse_normalization(const std::string& text);

// "mean 0.4914,0.4822,0.4465 std 0.2470,0.2435,0.2616", each value with up to 4 decimals.
std::string describe_normalization(const Normalization& normalization);

}  // namespace ptrain::data
