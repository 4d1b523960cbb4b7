// The run's splits as train opens and checks them, the run's data (run/run_data.h) made from them with the
// Plan's resolved values, and what running out of host memory while loading them means.
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

}  // namespace

Splits open_splits(const Plan& plan, int64_t replicas) {
  const int threads = static_cast<int>(plan.data_options.loader_threads);
  const data::DataSpec spec = plan.open_data ? plan.data : data::resolve_image_loading(plan.data);
  const auto open = [&](bool train) {
    return plan.open_data ? plan.open_data(train) : data::open_dataset(spec, train, threads);
  };
  Splits splits{data::spread_subset(open(/*train=*/true), plan.data_options.train_limit),
                data::spread_subset(open(/*train=*/false), plan.data_options.test_limit)};
  const auto& train_set = splits.train;
  const auto& test_set = splits.test;
  // Any source (a reader, a caller's open_data): an empty split trains nothing or evaluates to 0/0.
  check(train_set.size() > 0, source_of(train_set) + ": the training split holds no samples");
  check(test_set.size() > 0, source_of(test_set) + ": the test split holds no samples (nothing to evaluate)");
  if (!train_set.is_tokens())
    data::check_same_classes(source_of(train_set), train_set.classes, source_of(test_set), test_set.classes);
  const int64_t loader_batch = plan.length.batch_size * replicas;
  check(train_set.size() >= loader_batch,
        "--batch-size " + std::to_string(plan.length.batch_size) + " x " + std::to_string(replicas) +
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
  const models::ModelSpec spec = model_spec(plan, splits.train, splits.test);
  // A zoo model fits any data model_spec accepts; a TorchScript model is checked by loading it (on the host).
  if (!plan.make_model && models::is_torchscript_path(spec.name)) models::make_model(spec);
  return splits;
}

void TrainingRun::load_data() {
  Splits splits = open_splits(plan_, strategy_->replicas());
  RunData::Options options;
  options.device = device();
  options.batch_size = plan_.length.batch_size;
  options.eval_batch_size = plan_.cadence.eval_batch_size > 0 ? plan_.cadence.eval_batch_size : plan_.length.batch_size;
  options.replicas = strategy_->replicas();
  options.rank = strategy_->rank();
  options.world_size = strategy_->world_size();
  options.seed = plan_.cadence.seed;
  options.prefetch = plan_.data_options.prefetch;
  options.image_size = plan_.data.image_size;
  options.augment = plan_.data_options.augment;
  options.normalization = plan_.normalization;
  options.compute_dtype = policy().compute_dtype;
  options.channels_last = plan_.channels_last;
  options.grad_accum = plan_.length.grad_accum;
  options.epochs = plan_.length.epochs;
  options.max_steps = plan_.length.max_steps;
  data_ = std::make_unique<RunData>(std::move(splits.train), std::move(splits.test), options);
  recorder_.note_data_transforms(data_->transforms());
}

bool is_out_of_memory(const std::string& what) {
  // CUDA's caching allocator says "out of memory", the CPU allocator "can't allocate memory".
  return what.find("out of memory") != std::string::npos || what.find("can't allocate memory") != std::string::npos;
}

void TrainingRun::load_data_or_explain() {
  const auto advice = [&](const std::string& what) {
    const auto newline = what.find('\n');
    return Error("out of host memory while loading the data (" + what.substr(0, newline) + "): --dataset " +
                 plan_.data.name + " is held in memory whole, every sample at its decoded size" +
                 (plan_.data.image_size > 0
                      ? " (resized to --image-size " + std::to_string(plan_.data.image_size) + ")"
                      : "") +
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
