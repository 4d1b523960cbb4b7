#include "ptrain/data/jpeg_decode.h"

// jpeglib.h needs size_t and FILE declared before it.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <fstream>

#include <jerror.h>
#include <jpeglib.h>

#include "ptrain/core/error.h"

namespace ptrain::data {

namespace {

namespace fs = std::filesystem;

void read_bytes(const fs::path& path, std::vector<uint8_t>& bytes) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  check(static_cast<bool>(in), path.string() + ": cannot open image");
  const auto size = static_cast<std::streamoff>(in.tellg());
  check(size >= 0, path.string() + ": cannot read image");
  bytes.resize(static_cast<size_t>(size));
  in.seekg(0);
  check(static_cast<bool>(in.read(reinterpret_cast<char*>(bytes.data()), size)), path.string() + ": cannot read image");
}

std::vector<uint8_t> read_bytes(const fs::path& path) {
  std::vector<uint8_t> bytes;
  read_bytes(path, bytes);
  return bytes;
}

bool is_png(const fs::path& path) {
  std::string ext = path.extension().string();
  for (auto& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext == ".png";
}

// libjpeg's errors longjmp back to the caller, which throws outside the C frames;
// warnings (a truncated or damaged entropy stream, which libjpeg would fill with grey) are errors too,
// except extraneous bytes between markers, which real photo collections hold and PIL accepts.
struct JpegErrorManager {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void jpeg_error_exit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

void jpeg_emit_message(j_common_ptr cinfo, int level) {
  if (level < 0 && cinfo->err->msg_code != JWRN_EXTRANEOUS_DATA) jpeg_error_exit(cinfo);
}

// The smallest M in {1, 2, 4, 8} at which `extent` full-size pixels still span `wanted` decoded ones. Only
// these scales: libjpeg-turbo's SIMD inverse DCTs are the 8x8, 4x4 and 2x2 ones (1x1 is the DC term alone);
// at 3/8, 5/8, 6/8 and 7/8 it runs scalar 3x3..7x7 transforms (and 6x6..14x14 for subsampled chroma), slower
// than the SIMD one over the larger window, which the window decode keeps to the crop.
unsigned scale_for(double extent, int64_t wanted) {
  if (wanted <= 0 || extent <= 0) return 8;
  for (unsigned m = 1; m < 8; m *= 2) {
    if (extent * m / 8.0 >= static_cast<double>(wanted)) return m;
  }
  return 8;
}

// The rows or columns [begin, end) of a decoded axis of `size` pixels that resampling [start, start + extent)
// to `out` pixels reads (taps_for's support, rounded outwards), widened by two pixels: libjpeg-turbo's fancy
// upsampling of subsampled chroma replicates the edge of a cropped window where the whole frame has a
// neighbour, so the pixels within two of a window's edge are not those of the whole frame.
std::pair<int64_t, int64_t> window_for(double start, double extent, int64_t out, int64_t size) {
  const double support = std::max(extent / static_cast<double>(std::max<int64_t>(out, 1)), 1.0);
  const auto begin = static_cast<int64_t>(std::floor(start - support)) - 2;
  const auto end = static_cast<int64_t>(std::ceil(start + extent + support)) + 3;
  return {std::clamp<int64_t>(begin, 0, size), std::clamp<int64_t>(end, 0, size)};
}

void decode_jpeg(const std::vector<uint8_t>& bytes, const fs::path& path, const RegionFor& region_for,
                 ScaledImage& result) {
  jpeg_decompress_struct cinfo;
  JpegErrorManager err;
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = jpeg_error_exit;
  err.pub.emit_message = jpeg_emit_message;
  // Declared before setjmp: nothing with a destructor may be created between it and a longjmp.
  bool convertible = true;
  std::string region_error;
  std::vector<uint8_t> last_row;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    throw Error(path.string() + ": corrupt JPEG (" + err.message + ")");
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  convertible = cinfo.jpeg_color_space != JCS_CMYK && cinfo.jpeg_color_space != JCS_YCCK;
  region_error = image_size_problem(path, cinfo.image_width, cinfo.image_height);
  if (convertible && region_error.empty()) {
    try {
      result.request = region_for(cinfo.image_width, cinfo.image_height);
    } catch (const std::exception& e) {
      region_error = e.what();
    }
  }
  if (convertible && region_error.empty()) {
    const DecodeRequest& r = result.request;
    cinfo.out_color_space = JCS_RGB;  // libjpeg-turbo also expands greyscale to RGB
    cinfo.scale_num = std::max(scale_for(r.width, r.min_width), scale_for(r.height, r.min_height));
    cinfo.scale_denom = 8;
    jpeg_start_decompress(&cinfo);
    const int64_t frame_width = cinfo.output_width, frame_height = cinfo.output_height;
    result.scale_x = static_cast<double>(frame_width) / static_cast<double>(cinfo.image_width);
    result.scale_y = static_cast<double>(frame_height) / static_cast<double>(cinfo.image_height);
    std::pair<int64_t, int64_t> columns{0, frame_width}, rows{0, frame_height};
    if (!r.whole_frame) {
      columns = window_for(r.x * result.scale_x, r.width * result.scale_x, r.min_width, frame_width);
      rows = window_for(r.y * result.scale_y, r.height * result.scale_y, r.min_height, frame_height);
    }
    // Only the window's columns go through the inverse DCT, upsampling and colour conversion (libjpeg-turbo
    // widens it to whole iMCUs); the rows above it are skipped and those below entropy-decoded only.
    auto x_offset = static_cast<JDIMENSION>(columns.first);
    auto width = static_cast<JDIMENSION>(columns.second - columns.first);
    if (width < cinfo.output_width) jpeg_crop_scanline(&cinfo, &x_offset, &width);
    result.origin_x = x_offset;
    result.origin_y = rows.first;
    if (rows.first > 0) jpeg_skip_scanlines(&cinfo, static_cast<JDIMENSION>(rows.first));
    auto& image = result.image;
    image.height = rows.second - rows.first;
    image.width = cinfo.output_width;
    image.rgb.resize(static_cast<size_t>(image.height * image.width * 3));
    while (cinfo.output_scanline < rows.second) {
      JSAMPROW row = image.rgb.data() + static_cast<size_t>(cinfo.output_scanline - rows.first) * image.width * 3;
      jpeg_read_scanlines(&cinfo, &row, 1);
    }
    // Skipping to the very end would stop without reading the rest of the stream; reading the last row
    // entropy-decodes everything below the window, so a truncated or damaged file fails whatever the crop.
    if (cinfo.output_scanline < cinfo.output_height) {
      if (cinfo.output_scanline + 1 < cinfo.output_height) {
        jpeg_skip_scanlines(&cinfo, cinfo.output_height - 1 - cinfo.output_scanline);
      }
      last_row.resize(static_cast<size_t>(image.width) * 3);
      JSAMPROW row = last_row.data();
      jpeg_read_scanlines(&cinfo, &row, 1);
    }
    jpeg_finish_decompress(&cinfo);
  }
  jpeg_destroy_decompress(&cinfo);
  check(region_error.empty() || !convertible, region_error);
  check(convertible, path.string() + ": CMYK JPEG is not supported, convert it to RGB");
}

// One output coordinate's taps: the first input index and a weight for each following one.
struct Taps {
  std::vector<int64_t> first;
  std::vector<int64_t> count;
  std::vector<float> weights;  // count[i] per output i, back to back
  int64_t max_count = 0;
};

// PIL's ImagingResample coefficients for the triangle (bilinear) filter over [start, start + extent) of
// an axis of `size` pixels, made `out` pixels long.
Taps taps_for(double start, double extent, int64_t size, int64_t out) {
  Taps t;
  const double scale = extent / static_cast<double>(out);
  const double filter_scale = std::max(scale, 1.0);
  const double support = filter_scale;  // the triangle filter's support is 1
  for (int64_t i = 0; i < out; ++i) {
    const double center = start + (static_cast<double>(i) + 0.5) * scale;
    int64_t lo = static_cast<int64_t>(std::floor(center - support + 0.5));
    int64_t hi = static_cast<int64_t>(std::floor(center + support + 0.5));
    lo = std::clamp<int64_t>(lo, 0, size - 1);
    hi = std::clamp<int64_t>(hi, lo + 1, size);
    double total = 0;
    const size_t begin = t.weights.size();
    for (int64_t x = lo; x < hi; ++x) {
      const double w = std::max(0.0, 1.0 - std::abs((static_cast<double>(x) - center + 0.5) / filter_scale));
      t.weights.push_back(static_cast<float>(w));
      total += w;
    }
    if (total <= 0) {  // a region narrower than a pixel: take the nearest one
      for (size_t k = begin; k < t.weights.size(); ++k) t.weights[k] = 0;
      t.weights[begin] = 1;
      total = 1;
    }
    for (size_t k = begin; k < t.weights.size(); ++k) t.weights[k] = static_cast<float>(t.weights[k] / total);
    t.first.push_back(lo);
    t.count.push_back(hi - lo);
    t.max_count = std::max(t.max_count, hi - lo);
  }
  return t;
}

// Round half up, as lround does for the non-negative sums of a triangle filter, without libm's call.
uint8_t to_byte(float v) { return v <= 0.0f ? 0 : v >= 255.0f ? 255 : static_cast<uint8_t>(v + 0.5f); }

}  // namespace

void decode_for_region(const fs::path& path, const RegionFor& region_for, ScaledImage& into) {
  into.origin_x = into.origin_y = 0;
  into.scale_x = into.scale_y = 1;
  if (!is_png(path)) {
    // The file's bytes stay in a buffer of the decoding thread: a fresh one for each image costs page faults.
    thread_local std::vector<uint8_t> bytes;
    read_bytes(path, bytes);
    decode_jpeg(bytes, path, region_for, into);
    return;
  }
  into.image = decode_image_file(path);
  into.request = region_for(into.image.width, into.image.height);
}

ScaledImage decode_for_region(const fs::path& path, const RegionFor& region_for) {
  ScaledImage result;
  decode_for_region(path, region_for, result);
  return result;
}

std::string image_size_problem(const fs::path& path, int64_t width, int64_t height) {
  if (width <= 0 || height <= 0 || width <= kMaxImagePixels / height) return {};
  char decoded[32];
  std::snprintf(decoded, sizeof(decoded), "%.1f GiB",
                static_cast<double>(width) * static_cast<double>(height) * 3.0 / (1024.0 * 1024.0 * 1024.0));
  return path.string() + ": its header says " + std::to_string(width) + "x" + std::to_string(height) +
         " pixels, " + decoded + " decoded; images may have at most " + std::to_string(kMaxImagePixels) +
         " pixels (PIL's decompression-bomb limit): shrink or remove it";
}

std::pair<int64_t, int64_t> image_dimensions(const fs::path& path) {
  const auto bytes = read_bytes(path);
  const auto check_size = [&](int64_t width, int64_t height) {
    const std::string problem = image_size_problem(path, width, height);
    check(problem.empty(), problem);
  };
  if (is_png(path)) {
    // The IHDR chunk follows the 8-byte signature: length, "IHDR", then width and height, big-endian.
    check(bytes.size() >= 24 && std::memcmp(bytes.data() + 12, "IHDR", 4) == 0, path.string() + ": not a PNG file");
    const auto be32 = [&](size_t at) {
      return (int64_t{bytes[at]} << 24) | (int64_t{bytes[at + 1]} << 16) | (int64_t{bytes[at + 2]} << 8) | bytes[at + 3];
    };
    check_size(be32(16), be32(20));
    return {be32(16), be32(20)};
  }
  jpeg_decompress_struct cinfo;
  JpegErrorManager err;
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = jpeg_error_exit;
  err.pub.emit_message = jpeg_emit_message;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    throw Error(path.string() + ": corrupt JPEG (" + err.message + ")");
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  const std::pair<int64_t, int64_t> size{cinfo.image_width, cinfo.image_height};
  jpeg_destroy_decompress(&cinfo);
  check_size(size.first, size.second);
  return size;
}

void resample_region(const RgbImage& image, double x, double y, double width, double height, int64_t out_size,
                     bool flip, uint8_t* out) {
  check(image.width > 0 && image.height > 0 && out_size > 0, "resample: empty image or output");
  const Taps cols = taps_for(x, width, image.width, out_size);
  const Taps rows = taps_for(y, height, image.height, out_size);
  // Horizontal pass over the rows the vertical pass reads, into float rows of out_size x 3.
  const int64_t row_lo = rows.first.front();
  int64_t row_hi = row_lo;
  for (int64_t i = 0; i < out_size; ++i) row_hi = std::max(row_hi, rows.first[i] + rows.count[i]);
  // Scratch rows of the decoding thread, reused from image to image (fresh ones cost page faults).
  thread_local std::vector<float> horizontal, acc;
  horizontal.resize(static_cast<size_t>((row_hi - row_lo) * out_size * 3));
  for (int64_t r = row_lo; r < row_hi; ++r) {
    const uint8_t* src = image.rgb.data() + r * image.width * 3;
    float* dst = horizontal.data() + (r - row_lo) * out_size * 3;
    size_t k = 0;
    for (int64_t i = 0; i < out_size; ++i) {
      float acc[3] = {0, 0, 0};
      const uint8_t* p = src + cols.first[i] * 3;
      for (int64_t t = 0; t < cols.count[i]; ++t, ++k, p += 3) {
        const float w = cols.weights[k];
        acc[0] += w * p[0];
        acc[1] += w * p[1];
        acc[2] += w * p[2];
      }
      dst[i * 3] = acc[0];
      dst[i * 3 + 1] = acc[1];
      dst[i * 3 + 2] = acc[2];
    }
  }
  // Vertical pass, written planar (channel, row, column), mirrored when asked.
  const int64_t plane = out_size * out_size;
  size_t k = 0;
  acc.resize(static_cast<size_t>(out_size * 3));
  for (int64_t j = 0; j < out_size; ++j) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t t = 0; t < rows.count[j]; ++t, ++k) {
      const float w = rows.weights[k];
      const float* src = horizontal.data() + (rows.first[j] + t - row_lo) * out_size * 3;
      for (int64_t i = 0; i < out_size * 3; ++i) acc[i] += w * src[i];
    }
    for (int64_t i = 0; i < out_size; ++i) {
      const int64_t column = flip ? out_size - 1 - i : i;
      for (int64_t c = 0; c < 3; ++c) out[c * plane + j * out_size + column] = to_byte(acc[i * 3 + c]);
    }
  }
}

}  // namespace ptrain::data
