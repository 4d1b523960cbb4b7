// The run's datasets and loaders, split over the ranks, the step counts they give, and what running out of
// host memory while loading them means.
#include <algorithm>
#include <limits>

#include "ptrain/core/error.h"
#include "ptrain/data/image_folder.h"
#include "ptrain/data/registry.h"
#include "ptrain/models/torchscript_model.h"
#include "ptrain/train/training_run.h"

namespace ptrain::train {

namespace {

// "image folder /data/train" of "image folder /data/train (50000 images 3x32x32)": where a split comes from.
std::string source_of(const data::Dataset& set) { return set.description.substr(0, set.description.find(" (")); }

// What happens to a split's images between the file and the model, in order, as the run header and the run
// record state it.
std::string transforms_of(const data::Dataset& set, const data::AugmentOptions& options, bool train, int64_t size) {
  std::vector<std::string> steps;
  if (set.is_streamed()) {
    const bool random = train && (options.random_crop || options.horizontal_flip);
    steps.push_back(random ? "random resized crop to " + std::to_string(size) + " (scale 0.08-1, ratio 3/4-4/3)"
                           : "resize (shorter side " + std::to_string(size) + "/0.875), centre crop to " +
                                 std::to_string(size));
    if (random) steps.push_back("horizontal flip");
  } else {
    if (train && options.random_crop) steps.push_back("random crop (padding " + std::to_string(options.crop_padding) + ")");
    if (train && options.horizontal_flip) steps.push_back("horizontal flip");
    if (options.resize > 0) steps.push_back("resize to " + std::to_string(options.resize));
  }
  steps.push_back("scale to [0, 1]");
  steps.push_back("normalise " + data::describe_normalization({options.mean, options.std}));
  std::string text;
  for (const auto& step : steps) text += (text.empty() ? "" : ", ") + step;
  return text;
}

}  // namespace

Splits open_splits(const Plan& plan, int64_t replicas) {
  const auto& c = plan.config;
  const int threads = static_cast<int>(c.data.loader_threads);
  const data::DataSpec spec = plan.open_data ? plan.data : data::resolve_image_loading(plan.data);
  const auto open = [&](bool train) {
    return plan.open_data ? plan.open_data(train) : data::open_dataset(spec, train, threads);
  };
  Splits splits{data::spread_subset(open(/*train=*/true), c.data.train_limit),
                data::spread_subset(open(/*train=*/false), c.data.test_limit)};
  const auto& train_set = splits.train;
  const auto& test_set = splits.test;
  // Any source (a reader, a caller's open_data): an empty split trains nothing or evaluates to 0/0.
  check(train_set.size() > 0, source_of(train_set) + ": the training split holds no samples");
  check(test_set.size() > 0, source_of(test_set) + ": the test split holds no samples (nothing to evaluate)");
  if (!train_set.is_tokens())
    data::check_same_classes(source_of(train_set), train_set.classes, source_of(test_set), test_set.classes);
  const int64_t loader_batch = c.run.batch_size * replicas;
  check(train_set.size() >= loader_batch,
        "--batch-size " + std::to_string(c.run.batch_size) + " x " + std::to_string(replicas) +
            " replicas is larger than the " + std::to_string(train_set.size()) + " training samples");
  const auto& norm = plan.normalization;
  if (!train_set.is_tokens()) {
    const auto values = static_cast<int64_t>(norm.mean.size());
    check(values == 1 || values == train_set.channels(),
          "--normalize " + data::describe_normalization(norm) + ": " + std::to_string(values) + " values a channel, but " +
              source_of(train_set) + " has " + std::to_string(train_set.channels()) + "-channel images (give " +
              std::to_string(train_set.channels()) + " values, or one for all)");
  }
  return splits;
}

Splits check_before_training(const Plan& plan, int64_t replicas) {
  Splits splits = open_splits(plan, replicas);
  const models::ModelSpec spec = model_spec(plan.config, splits.train, splits.test);
  // A zoo model fits any data model_spec accepts; a TorchScript model is checked by loading it (on the host).
  if (!plan.make_model && models::is_torchscript_path(spec.name)) models::make_model(spec);
  return splits;
}

void TrainingRun::load_data() {
  Splits splits = open_splits(plan_, strategy_->replicas());
  train_set_ = std::move(splits.train);
  test_set_ = std::move(splits.test);
  const int64_t loader_batch = c_.run.batch_size * strategy_->replicas();

  const auto& norm = plan_.normalization;
  data::AugmentOptions eval_augment;
  eval_augment.resize = c_.data.image_size;
  eval_augment.mean = norm.mean;
  eval_augment.std = norm.std;
  eval_augment.out_dtype = policy_.compute_dtype;
  eval_augment.channels_last = plan_.channels_last;
  data::AugmentOptions train_augment = eval_augment;
  train_augment.random_crop = c_.data.augment;
  train_augment.horizontal_flip = c_.data.augment;

  data::LoaderOptions train_options;
  train_options.batch_size = loader_batch;
  train_options.shuffle = true;
  train_options.drop_last = true;
  train_options.seed = c_.run.seed;
  train_options.rank = strategy_->rank();
  train_options.world_size = strategy_->world_size();
  train_options.device = device_;
  train_options.prefetch = c_.data.prefetch;
  train_options.augment = train_augment;
  train_options.train = true;
  train_loader_ = std::make_unique<data::Loader>(train_set_, train_options);

  data::LoaderOptions test_options = train_options;
  test_options.batch_size =
      (c_.run.eval_batch_size > 0 ? c_.run.eval_batch_size : c_.run.batch_size) * strategy_->replicas();
  test_options.shuffle = false;
  test_options.drop_last = false;
  test_options.augment = eval_augment;
  test_options.train = false;
  test_loader_ = std::make_unique<data::Loader>(test_set_, test_options);
  if (train_set_.is_tokens()) {
    record_.extra["data_transforms"] = {{"normalize", nullptr}, {"train", "none (tokens)"}, {"test", "none (tokens)"}};
  } else {
    const int64_t size = c_.data.image_size > 0 ? c_.data.image_size : train_set_.height();
    record_.extra["data_transforms"] = {{"normalize", {{"mean", norm.mean}, {"std", norm.std}}},
                                        {"augment", c_.data.augment},
                                        {"train", transforms_of(train_set_, train_augment, true, size)},
                                        {"test", transforms_of(test_set_, eval_augment, false, size)}};
  }

  micro_batches_per_epoch_ = train_loader_->batches_per_epoch();
  const RunSteps steps = run_steps(c_, micro_batches_per_epoch_);
  steps_per_epoch_ = steps.steps_per_epoch;
  epochs_ = steps.epochs;
  total_steps_ = steps.total_steps;
}

bool is_out_of_memory(const std::string& what) {
  // CUDA's caching allocator says "out of memory", the CPU allocator "can't allocate memory".
  return what.find("out of memory") != std::string::npos || what.find("can't allocate memory") != std::string::npos;
}

void TrainingRun::load_data_or_explain() {
  const auto advice = [&](const std::string& what) {
    const auto newline = what.find('\n');
    return Error("out of host memory while loading the data (" + what.substr(0, newline) + "): --dataset " +
                 c_.data.dataset + " is held in memory whole, every sample at its decoded size" +
                 (c_.data.image_size > 0 ? " (resized to --image-size " + std::to_string(c_.data.image_size) + ")" : "") +
                 ". To fit: fewer samples (--train-limit, --test-limit), a smaller --image-size or --seq-len, or "
                 "more host memory; the model and its batch size are not the cause");
  };
  try {
    load_data();
  } catch (const c10::Error& e) {
    if (!is_out_of_memory(e.what_without_backtrace())) throw;
    throw advice(e.what_without_backtrace());
  } catch (const std::bad_alloc& e) {
    throw advice(e.what());
  }
}

}  // namespace ptrain::train
