// Decoding one image of a streamed folder for the crop it will be cut to: libjpeg-turbo decodes a JPEG at
// the smallest of its DCT scales M/8 (M = 1..8) at which the crop still spans the output size, so a 500x375
// photo cropped to 224 pixels is decoded at 1/2 or less and costs a fraction of a full decode; then the
// crop is resampled to the output size.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "ptrain/data/image_folder.h"

namespace ptrain::data {

// A region of the full-size image (pixels, may be fractional) and the least width and height it must keep
// when decoded: the crop and the output size.
struct DecodeRequest {
  double x = 0, y = 0, width = 0, height = 0;
  int64_t min_width = 0, min_height = 0;
};

// Decided once the image's full size is known (from its header, before any pixel is decoded).
using RegionFor = std::function<DecodeRequest(int64_t width, int64_t height)>;

struct ScaledImage {
  RgbImage image;           // as decoded, at the chosen scale
  DecodeRequest request;    // in full-size pixels
  double scale_x = 1, scale_y = 1;  // decoded pixels per full-size pixel
};

// JPEG at a reduced DCT scale (libjpeg-turbo's scale_num/scale_denom); PNG (by the extension) at full size
// with libpng. Throws ptrain::Error naming path for a file that is missing or corrupt.
ScaledImage decode_for_region(const std::filesystem::path& path, const RegionFor& region_for);

// Width and height from the file's header alone (JPEG or PNG).
std::pair<int64_t, int64_t> image_dimensions(const std::filesystem::path& path);

// Resamples the region (in the decoded image's pixels) to out_size x out_size with a triangle filter
// widened by the reduction factor (PIL's antialiased bilinear resize with a box), into out as planar
// uint8 3 x out_size x out_size, mirrored left to right when flip is set.
void resample_region(const RgbImage& image, double x, double y, double width, double height, int64_t out_size,
                     bool flip, uint8_t* out);

}  // namespace ptrain::data
