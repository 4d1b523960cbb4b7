#include "ptrain/data/jpeg_decode.h"

// jpeglib.h needs size_t and FILE declared before it.
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

std::vector<uint8_t> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  check(static_cast<bool>(in), path.string() + ": cannot open image");
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
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

// The smallest M in 1..8 at which `extent` full-size pixels still span `wanted` decoded ones.
unsigned scale_for(double extent, int64_t wanted) {
  if (wanted <= 0 || extent <= 0) return 8;
  for (unsigned m = 1; m < 8; ++m) {
    if (extent * m / 8.0 >= static_cast<double>(wanted)) return m;
  }
  return 8;
}

ScaledImage decode_jpeg(const std::vector<uint8_t>& bytes, const fs::path& path, const RegionFor& region_for) {
  jpeg_decompress_struct cinfo;
  JpegErrorManager err;
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = jpeg_error_exit;
  err.pub.emit_message = jpeg_emit_message;
  // Declared before setjmp: nothing with a destructor may be created between it and a longjmp.
  ScaledImage result;
  bool convertible = true;
  std::string region_error;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    throw Error(path.string() + ": corrupt JPEG (" + err.message + ")");
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  convertible = cinfo.jpeg_color_space != JCS_CMYK && cinfo.jpeg_color_space != JCS_YCCK;
  if (convertible) {
    try {
      result.request = region_for(cinfo.image_width, cinfo.image_height);
    } catch (const std::exception& e) {
      region_error = e.what();
    }
  }
  if (convertible && region_error.empty()) {
    cinfo.out_color_space = JCS_RGB;  // libjpeg-turbo also expands greyscale to RGB
    cinfo.scale_num = std::max(scale_for(result.request.width, result.request.min_width),
                               scale_for(result.request.height, result.request.min_height));
    cinfo.scale_denom = 8;
    jpeg_start_decompress(&cinfo);
    auto& image = result.image;
    image.height = cinfo.output_height;
    image.width = cinfo.output_width;
    image.rgb.resize(static_cast<size_t>(image.height * image.width * 3));
    while (cinfo.output_scanline < cinfo.output_height) {
      JSAMPROW row = image.rgb.data() + static_cast<size_t>(cinfo.output_scanline) * image.width * 3;
      jpeg_read_scanlines(&cinfo, &row, 1);
    }
    jpeg_finish_decompress(&cinfo);
    result.scale_x = static_cast<double>(image.width) / static_cast<double>(cinfo.image_width);
    result.scale_y = static_cast<double>(image.height) / static_cast<double>(cinfo.image_height);
  }
  jpeg_destroy_decompress(&cinfo);
  check(convertible, path.string() + ": CMYK JPEG is not supported, convert it to RGB");
  check(region_error.empty(), region_error);
  return result;
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

uint8_t to_byte(float v) { return static_cast<uint8_t>(std::clamp(std::lround(v), 0L, 255L)); }

}  // namespace

ScaledImage decode_for_region(const fs::path& path, const RegionFor& region_for) {
  if (!is_png(path)) return decode_jpeg(read_bytes(path), path, region_for);
  ScaledImage result;
  result.image = decode_image_file(path);
  result.request = region_for(result.image.width, result.image.height);
  return result;
}

std::pair<int64_t, int64_t> image_dimensions(const fs::path& path) {
  const auto bytes = read_bytes(path);
  if (is_png(path)) {
    // The IHDR chunk follows the 8-byte signature: length, "IHDR", then width and height, big-endian.
    check(bytes.size() >= 24 && std::memcmp(bytes.data() + 12, "IHDR", 4) == 0, path.string() + ": not a PNG file");
    const auto be32 = [&](size_t at) {
      return (int64_t{bytes[at]} << 24) | (int64_t{bytes[at + 1]} << 16) | (int64_t{bytes[at + 2]} << 8) | bytes[at + 3];
    };
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
  std::vector<float> horizontal(static_cast<size_t>((row_hi - row_lo) * out_size * 3));
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
  std::vector<float> acc(static_cast<size_t>(out_size * 3));
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
