// Decoding one image of a streamed folder for the crop it will be cut to: libjpeg-turbo decodes a JPEG at
// the smallest of its DCT scales 1/8, 2/8, 4/8, 8/8 at which the crop still spans the output size, and only
// the window of the frame that resampling the crop reads (rows above it skipped, columns beside it cropped,
// rows below it entropy-decoded only), so a 500x375 photo cropped to 224 pixels costs a fraction of a full
// decode; then the crop is resampled to the output size.
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
  // Decode every pixel of the frame, not only the crop's window: what the window's pixels are checked
  // against, and a whole image held in memory.
  bool whole_frame = false;
};

// Decided once the image's full size is known (from its header, before any pixel is decoded).
using RegionFor = std::function<DecodeRequest(int64_t width, int64_t height)>;

struct ScaledImage {
  RgbImage image;           // the decoded window, at the chosen scale
  DecodeRequest request;    // in full-size pixels
  double scale_x = 1, scale_y = 1;  // decoded pixels per full-size pixel
  int64_t origin_x = 0, origin_y = 0;  // the window's top-left corner in the decoded frame
};

// JPEG at a reduced DCT scale (libjpeg-turbo's scale_num/scale_denom), the window of the request's region;
// PNG (by the extension) whole at full size with libpng. Throws ptrain::Error naming path for a file that is
// missing or corrupt, wherever in the file the damage lies.
ScaledImage decode_for_region(const std::filesystem::path& path, const RegionFor& region_for);
// The same into `into`, whose buffers a decoding thread reuses from image to image.
void decode_for_region(const std::filesystem::path& path, const RegionFor& region_for, ScaledImage& into);

// The most pixels an image may have: PIL's limit of a decompression bomb (twice Image.MAX_IMAGE_PIXELS), 179
// million, 0.5 GB decoded as RGB. A 3 kB file's header may claim 65500 x 65500: every loader (whole folders,
// streamed ones, header reads) refuses such a file from its header, before allocating for its pixels.
constexpr int64_t kMaxImagePixels = 178956970;
// Empty when width x height is within kMaxImagePixels, else the error, naming path, its size and the bound.
std::string image_size_problem(const std::filesystem::path& path, int64_t width, int64_t height);

// Width and height from the file's header alone (JPEG or PNG); a size beyond kMaxImagePixels is an error.
std::pair<int64_t, int64_t> image_dimensions(const std::filesystem::path& path);

// Resamples the region (in the decoded image's pixels) to out_size x out_size with a triangle filter
// widened by the reduction factor (PIL's antialiased bilinear resize with a box), into out as planar
// uint8 3 x out_size x out_size, mirrored left to right when flip is set.
void resample_region(const RgbImage& image, double x, double y, double width, double height, int64_t out_size,
                     bool flip, uint8_t* out);

}  // namespace ptrain::data
