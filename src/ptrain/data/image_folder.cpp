#include "ptrain/data/image_folder.h"

#include <algorithm>
#include <cctype>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <png.h>

#include "ptrain/core/error.h"
#include "ptrain/data/jpeg_decode.h"

namespace ptrain::data {

namespace {

namespace fs = std::filesystem;

using DecodedImage = RgbImage;

std::vector<uint8_t> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  check(static_cast<bool>(in), path.string() + ": cannot open image");
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

struct PngReadState {
  const std::vector<uint8_t>* bytes;
  size_t offset;
  char message[256];
};

void png_read_from_memory(png_structp png, png_bytep out, png_size_t length) {
  auto* state = static_cast<PngReadState*>(png_get_io_ptr(png));
  if (state->offset + length > state->bytes->size()) png_error(png, "file is truncated");
  std::memcpy(out, state->bytes->data() + state->offset, length);
  state->offset += length;
}

// libpng's default error handler prints and longjmps; ours keeps the message for the exception and stays quiet.
void png_error_handler(png_structp png, png_const_charp message) {
  auto* state = static_cast<PngReadState*>(png_get_error_ptr(png));
  std::snprintf(state->message, sizeof(state->message), "%s", message);
  png_longjmp(png, 1);
}

void png_warning_handler(png_structp, png_const_charp) {}

DecodedImage decode_png(const std::vector<uint8_t>& bytes, const fs::path& path) {
  check(bytes.size() >= 8 && png_sig_cmp(bytes.data(), 0, 8) == 0, path.string() + ": not a PNG file (bad signature)");
  PngReadState state{&bytes, 8, ""};
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &state, png_error_handler, png_warning_handler);
  check(png != nullptr, path.string() + ": libpng could not allocate a reader");
  png_infop info = png_create_info_struct(png);
  DecodedImage image;
  std::vector<png_bytep> rows;
  std::string too_large;
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    throw Error(path.string() + ": corrupt PNG (" + state.message + ")");
  }
  if (info == nullptr) png_error(png, "cannot allocate info");
  png_set_read_fn(png, &state, png_read_from_memory);
  png_set_sig_bytes(png, 8);
  png_read_info(png, info);
  too_large = image_size_problem(path, png_get_image_width(png, info), png_get_image_height(png, info));
  if (!too_large.empty()) {
    png_destroy_read_struct(&png, &info, nullptr);
    throw Error(too_large);
  }
  // Everything becomes 8-bit RGB: palette and low bit depths expanded, 16 bits cut to their high byte (as PIL
  // does), grey replicated, alpha dropped (PIL's convert("RGB") drops it without compositing).
  png_set_expand(png);
  png_set_strip_16(png);
  png_set_strip_alpha(png);
  png_set_gray_to_rgb(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  image.height = png_get_image_height(png, info);
  image.width = png_get_image_width(png, info);
  if (png_get_rowbytes(png, info) != static_cast<size_t>(image.width * 3)) png_error(png, "unexpected row layout");
  image.rgb.resize(static_cast<size_t>(image.height * image.width * 3));
  rows.resize(static_cast<size_t>(image.height));
  for (int64_t y = 0; y < image.height; ++y) rows[y] = image.rgb.data() + y * image.width * 3;
  png_read_image(png, rows.data());
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  return image;
}

std::string lower_extension(const fs::path& path) {
  std::string ext = path.extension().string();
  for (auto& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext;
}

DecodedImage decode_image(const fs::path& path) {
  if (lower_extension(path) == ".png") return decode_png(read_file(path), path);
  // A JPEG whole: the region decoder (jpeg_decode.h) at full scale, the one libjpeg path of the folder loaders.
  return decode_for_region(path, [](int64_t width, int64_t height) {
           return DecodeRequest{0, 0, static_cast<double>(width), static_cast<double>(height), width, height,
                                /*whole_frame=*/true};
         }).image;
}

std::string size_text(int64_t h, int64_t w) { return std::to_string(w) + "x" + std::to_string(h); }

}  // namespace

RgbImage decode_image_file(const fs::path& path) { return decode_image(path); }

ImageFolderListing list_image_folder(const std::string& root_name) {
  const fs::path root(root_name);
  check(fs::is_directory(root), root_name + ": image folder not found");

  std::vector<std::string> classes;
  for (const auto& entry : fs::directory_iterator(root)) {
    if (entry.is_directory()) classes.push_back(entry.path().filename().string());
  }
  std::sort(classes.begin(), classes.end());
  check(!classes.empty(), root_name + ": no class sub-folders in image folder");

  std::vector<fs::path> files;
  std::vector<int64_t> file_labels;
  for (size_t c = 0; c < classes.size(); ++c) {
    // ImageFolder walks each class folder recursively, ordered by (directory, file name): sorted(os.walk(...)).
    std::vector<std::pair<std::string, std::string>> class_files;
    for (const auto& entry :
         fs::recursive_directory_iterator(root / classes[c], fs::directory_options::follow_directory_symlink)) {
      const auto ext = lower_extension(entry.path());
      if (entry.is_regular_file() && (ext == ".jpg" || ext == ".jpeg" || ext == ".png"))
        class_files.emplace_back(entry.path().parent_path().string(), entry.path().filename().string());
    }
    check(!class_files.empty(), (root / classes[c]).string() +
                                    ": class folder holds no .jpg, .jpeg or .png file (remove it, or add its images)");
    std::sort(class_files.begin(), class_files.end());
    for (const auto& [dir, name] : class_files) {
      files.push_back(fs::path(dir) / name);
      file_labels.push_back(static_cast<int64_t>(c));
    }
  }
  check(!files.empty(), root_name + ": no .jpg, .jpeg or .png files in the class sub-folders");
  return {std::move(classes), std::move(files), std::move(file_labels)};
}

Dataset load_image_folder(const std::string& root_name, int threads) {
  ImageFolderListing listing = list_image_folder(root_name);
  auto& classes = listing.classes;
  const auto& files = listing.files;
  const auto& file_labels = listing.labels;

  // The first image fixes the size, so every worker can decode straight into its slot of the final tensor.
  const auto first = decode_image(files[0]);
  const auto n = static_cast<int64_t>(files.size());
  const int64_t height = first.height, width = first.width, plane = height * width;
  auto images = torch::empty({n, 3, height, width}, torch::kUInt8);
  uint8_t* out = images.data_ptr<uint8_t>();

  // Per file: empty when fine, else the error; reported for the first file in sorted order so the message does
  // not depend on thread timing.
  std::vector<std::string> errors(files.size());
  std::atomic<int64_t> next_file{0};
  auto worker = [&] {
    for (int64_t i = next_file++; i < n; i = next_file++) {
      try {
        const auto image = i == 0 ? first : decode_image(files[i]);
        if (image.height != height || image.width != width) {
          errors[i] = files[i].string() + ": image size " + size_text(image.height, image.width) + " differs from " +
                      size_text(height, width) + " of " + files[0].string() + "; all images must share one size";
          continue;
        }
        uint8_t* dst = out + i * 3 * plane;
        for (int64_t p = 0; p < plane; ++p)
          for (int64_t ch = 0; ch < 3; ++ch) dst[ch * plane + p] = image.rgb[p * 3 + ch];
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::max(threads, 1); ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  for (const auto& e : errors) check(e.empty(), e);

  Dataset ds;
  ds.images = images;
  ds.labels = torch::tensor(file_labels, torch::kInt64);
  ds.classes = std::move(classes);
  ds.description = "image folder " + root_name + " (" + std::to_string(n) + " images 3x" + std::to_string(height) +
                   "x" + std::to_string(width) + ")";
  return ds;
}

void check_same_classes(const std::string& train_name, const std::vector<std::string>& train_classes,
                        const std::string& test_name, const std::vector<std::string>& test_classes) {
  if (train_classes == test_classes) return;
  const auto missing = [](const std::vector<std::string>& from, const std::vector<std::string>& in) {
    std::string names;
    int listed = 0, count = 0;
    for (const auto& name : from) {
      if (std::find(in.begin(), in.end(), name) != in.end()) continue;
      ++count;
      if (listed++ < 8) names += (names.empty() ? "'" : ", '") + name + "'";
    }
    if (count > listed) names += " and " + std::to_string(count - listed) + " more";
    return names;
  };
  const std::string only_train = missing(train_classes, test_classes);
  const std::string only_test = missing(test_classes, train_classes);
  std::string what;
  if (!only_train.empty()) what += test_name + " lacks " + only_train;
  if (!only_test.empty()) what += (what.empty() ? "" : "; ") + train_name + " lacks " + only_test;
  if (what.empty()) what = "the same names in another order";
  throw Error("the classes of " + train_name + " (" + std::to_string(train_classes.size()) + ") and " + test_name +
              " (" + std::to_string(test_classes.size()) + ") differ: " + what +
              "; labels are positions in the sorted class list, so both splits need the same classes");
}

}  // namespace ptrain::data
