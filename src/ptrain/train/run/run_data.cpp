#include "ptrain/train/run/run_data.h"

#include <algorithm>
#include <utility>

#include "ptrain/train/schedule.h"

namespace ptrain::train {

namespace {

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

RunData::RunData(data::Dataset train, data::Dataset test, const Options& options)
    : options_(options), train_set_(std::move(train)), test_set_(std::move(test)) {
  const auto& norm = options_.normalization;
  data::AugmentOptions eval_augment;
  eval_augment.resize = options_.image_size;
  eval_augment.mean = norm.mean;
  eval_augment.std = norm.std;
  eval_augment.out_dtype = options_.compute_dtype;
  eval_augment.channels_last = options_.channels_last;
  data::AugmentOptions train_augment = eval_augment;
  train_augment.random_crop = options_.augment;
  train_augment.horizontal_flip = options_.augment;

  data::LoaderOptions train_options;
  train_options.batch_size = options_.batch_size * options_.replicas;
  train_options.shuffle = true;
  train_options.drop_last = true;
  train_options.seed = options_.seed;
  train_options.rank = options_.rank;
  train_options.world_size = options_.world_size;
  train_options.device = options_.device;
  train_options.prefetch = options_.prefetch;
  train_options.augment = train_augment;
  train_options.train = true;
  train_loader_ = std::make_unique<data::Loader>(train_set_, train_options);

  data::LoaderOptions test_options = train_options;
  test_options.batch_size = options_.eval_batch_size * options_.replicas;
  test_options.shuffle = false;
  test_options.drop_last = false;
  test_options.augment = eval_augment;
  test_options.train = false;
  test_loader_ = std::make_unique<data::Loader>(test_set_, test_options);
  if (train_set_.is_tokens()) {
    transforms_ = {{"normalize", nullptr}, {"train", "none (tokens)"}, {"test", "none (tokens)"}};
  } else {
    const int64_t size = image_size();
    transforms_ = {{"normalize", {{"mean", norm.mean}, {"std", norm.std}}},
                   {"augment", options_.augment},
                   {"train", transforms_of(train_set_, train_augment, true, size)},
                   {"test", transforms_of(test_set_, eval_augment, false, size)}};
  }

  micro_batches_per_epoch_ = train_loader_->batches_per_epoch();
  const RunLength length{options_.epochs, options_.max_steps, options_.grad_accum, options_.batch_size};
  const RunSteps steps = run_steps(length, micro_batches_per_epoch_);
  steps_per_epoch_ = steps.steps_per_epoch;
  epochs_ = steps.epochs;
  total_steps_ = steps.total_steps;
}

int64_t RunData::micro_batches_of(int64_t steps) const {
  return std::min(steps * options_.grad_accum, micro_batches_per_epoch_);
}

int64_t RunData::sequence_length() const { return train_set_.is_tokens() ? train_set_.images.size(1) : 0; }

std::vector<int64_t> RunData::sample_shape() const {
  if (train_set_.is_tokens()) return {train_set_.images.size(1)};
  const int64_t size = options_.image_size;
  return {train_set_.channels(), size > 0 ? size : train_set_.height(), size > 0 ? size : train_set_.width()};
}

int64_t RunData::image_size() const {
  if (train_set_.is_tokens()) return 0;
  return options_.image_size > 0 ? options_.image_size : train_set_.height();
}

}  // namespace ptrain::train
