// A folder of images laid out as torchvision's ImageFolder expects.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "ptrain/data/dataset.h"

namespace ptrain::data {

// What load_image_folder finds under root, before decoding anything; the streaming folder
// (streaming_image_folder.h) reads the same listing.
struct ImageFolderListing {
  std::vector<std::string> classes;
  std::vector<std::filesystem::path> files;
  std::vector<int64_t> labels;  // per file, its class's index
};
ImageFolderListing list_image_folder(const std::string& root);

// One image as interleaved 8-bit RGB, H x W x 3.
struct RgbImage {
  int64_t height = 0;
  int64_t width = 0;
  std::vector<uint8_t> rgb;
};

// Decodes a .png with libpng and anything else as a JPEG, as load_image_folder does; throws ptrain::Error
// naming the file when it is corrupt.
RgbImage decode_image_file(const std::filesystem::path& path);

// root/<class>/.../<file>: classes are the sub-folders sorted by name, files found recursively within a class
// and ordered by (directory, name) as ImageFolder orders them,
// extensions .jpg .jpeg .png in any case. JPEG is decoded by libjpeg-turbo, PNG by libpng; grey images are
// expanded to RGB and an alpha channel is dropped, as ImageFolder's default loader (PIL convert("RGB")) does.
// All images must share one size. Decoding runs on `threads` worker threads (at least one).
// A class folder without any image is refused (naming it), as ImageFolder refuses it: it would add a class
// no sample has.
Dataset load_image_folder(const std::string& root, int threads);

// Refuses (ptrain::Error naming both splits and the classes that differ) a train and a test split whose
// class lists differ: labels are indices into the sorted class list, so a class missing from one split
// shifts the labels of every class after it and the test split would be scored against the wrong ones.
void check_same_classes(const std::string& train_name, const std::vector<std::string>& train_classes,
                        const std::string& test_name, const std::vector<std::string>& test_classes);

}  // namespace ptrain::data
