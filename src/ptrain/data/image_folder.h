// A folder of images laid out as torchvision's ImageFolder expects.
#pragma once

#include <string>

#include "ptrain/data/dataset.h"

namespace ptrain::data {

// root/<class>/.../<file>: classes are the sub-folders sorted by name, files found recursively within a class
// and ordered by (directory, name) as ImageFolder orders them,
// extensions .jpg .jpeg .png in any case. JPEG is decoded by libjpeg-turbo, PNG by libpng; grey images are
// expanded to RGB and an alpha channel is dropped, as ImageFolder's default loader (PIL convert("RGB")) does.
// All images must share one size. Decoding runs on `threads` worker threads (at least one).
Dataset load_image_folder(const std::string& root, int threads);

}  // namespace ptrain::data
