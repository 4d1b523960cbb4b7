// ptrain-loader-bench: how many images a second the data loader delivers from an image folder, as training
// reads it (the same Loader, workers and crops), without a model. Compare with the images a second the
// training step consumes (a run record's steady_images_per_second) to know whether the loader keeps up.
//
//   ptrain-loader-bench --data-path DIR --image-size 224 --loader-threads 16 [--batch-size 256] [--batches 40]
#include <chrono>
#include <cstdio>
#include <iostream>
#include <thread>

#include <CLI/CLI.hpp>

#include "ptrain/core/error.h"
#include "ptrain/data/loader.h"
#include "ptrain/data/registry.h"

int main(int argc, char** argv) {
  CLI::App app{"ptrain-loader-bench: the data loader's throughput on an image folder (images/s), without a model"};
  ptrain::data::DataSpec spec;
  spec.name = "imagefolder";
  spec.image_loading = "stream";
  spec.image_size = 224;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int64_t batch_size = 256, batches = 40, prefetch = 2;
  std::string device = "cpu";
  bool evaluation = false;
  app.add_option("--data-path", spec.path, "Folder holding train/ (and test/), laid out as torchvision's ImageFolder")
      ->required();
  app.add_option("--dataset", spec.name, "imagefolder or cifar10")->capture_default_str();
  app.add_option("--image-loading", spec.image_loading, "stream | memory | auto")->capture_default_str();
  app.add_option("--image-size", spec.image_size, "Side of the crops")->capture_default_str();
  app.add_option("--loader-threads", threads, "Decode workers (default: every hardware thread)")->capture_default_str();
  app.add_option("--batch-size", batch_size, "Images a batch")->capture_default_str();
  app.add_option("--batches", batches, "Batches to time, after one of warm-up")->capture_default_str();
  app.add_option("--prefetch", prefetch, "Batches kept ready ahead")->capture_default_str();
  app.add_option("--device", device, "Where batches go: cpu or cuda[:N] (pinned copies and normalisation there)")
      ->capture_default_str();
  app.add_flag("--eval", evaluation, "Evaluation crops (resize + centre crop) instead of random resized crops + flips");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help succeeds; a refused flag is one line and exit 2, as ptrain says it.
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    std::cerr << "ptrain-loader-bench: error: " << e.what() << std::endl;
    return 2;
  }
  try {
    const auto dataset = ptrain::data::open_dataset(spec, /*train=*/!evaluation, threads);
    ptrain::data::LoaderOptions options;
    options.batch_size = batch_size;
    options.shuffle = true;
    options.drop_last = true;
    options.device = torch::Device(device);
    options.prefetch = prefetch;
    options.train = !evaluation;
    options.augment.random_crop = options.augment.horizontal_flip = !evaluation;
    options.augment.mean = {0.5f};
    options.augment.std = {0.5f};
    ptrain::data::Loader loader(dataset, options);
    std::cout << dataset.description << ", " << threads << " loader threads, batch " << batch_size << std::endl;
    int64_t timed = 0, images = 0, epoch = 0;
    loader.start_epoch(epoch);
    std::chrono::steady_clock::time_point start;
    for (int64_t b = 0; b <= batches; ++b) {
      auto batch = loader.next();
      if (!batch) {
        loader.start_epoch(++epoch);
        batch = loader.next();
      }
      ptrain::check(batch.has_value(), "the folder holds less than one batch");
      // One element back waits for the batch's copy and normalisation; copying the whole batch back to
      // pageable host memory would time that copy instead of the loader.
      if (batch->images.is_cuda()) (void)batch->images.flatten()[0].item<float>();
      if (b == 0) {
        start = std::chrono::steady_clock::now();  // the first batch pays for starting the workers
        continue;
      }
      images += batch->images.size(0);
      ++timed;
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    char line[256];
    std::snprintf(line, sizeof(line), "%lld batches, %lld images in %.2f s: %.0f images/s (%.0f per thread)",
                  static_cast<long long>(timed), static_cast<long long>(images), seconds, images / seconds,
                  images / seconds / threads);
    std::cout << line << std::endl;
  } catch (const ptrain::Error& e) {
    std::cerr << "ptrain-loader-bench: error: " << e.what() << std::endl;
    return 2;
  } catch (const c10::Error& e) {
    std::cerr << "ptrain-loader-bench: LibTorch error: " << e.what_without_backtrace() << std::endl;
    return 3;
  }
  return 0;
}
