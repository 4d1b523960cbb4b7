// The run's data: its two splits, their loaders split over the ranks, and the optimizer steps they make (an
// epoch's micro-batches in windows of --grad-accum, the run's length in epochs and steps). Built from the
// splits open_splits opened and the Plan's resolved values; the datasets outlive the loaders that read them,
// so a RunData never moves.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "ptrain/data/dataset.h"
#include "ptrain/data/loader.h"
#include "ptrain/data/registry.h"

namespace ptrain::train {

class RunData {
 public:
  struct Options {
    torch::Device device = torch::kCPU;
    int64_t batch_size = 0;       // per device: a loader's batch is this x replicas
    int64_t eval_batch_size = 0;  // per device, resolved (--eval-batch-size, or batch_size)
    int64_t replicas = 1;         // the devices this process drives
    int64_t rank = 0, world_size = 1;
    uint64_t seed = 0;
    int64_t prefetch = 2;
    int64_t image_size = 0;  // --image-size; 0: the data's own
    bool augment = false;
    data::Normalization normalization;  // --normalize resolved
    c10::ScalarType compute_dtype = torch::kFloat;
    bool channels_last = false;
    // What sets the run's length: run_steps turns them and an epoch's micro-batches into its steps.
    int64_t grad_accum = 1, epochs = 1, max_steps = 0;
  };

  // Throws ptrain::Error naming the flags where an epoch holds fewer micro-batches than one step's window.
  RunData(data::Dataset train, data::Dataset test, const Options& options);
  RunData(const RunData&) = delete;
  RunData& operator=(const RunData&) = delete;

  const data::Dataset& train_set() const { return train_set_; }
  const data::Dataset& test_set() const { return test_set_; }
  data::Loader& train_loader() { return *train_loader_; }
  data::Loader& test_loader() { return *test_loader_; }
  const data::Loader& train_loader() const { return *train_loader_; }

  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  int64_t epochs() const { return epochs_; }  // --epochs, or the epochs --max-steps takes
  int64_t total_steps() const { return total_steps_; }
  // The last step's window of them may be shorter than --grad-accum.
  int64_t micro_batches_per_epoch() const { return micro_batches_per_epoch_; }
  // The micro-batches of an epoch that its first `steps` optimizer steps read (the last window may be short).
  int64_t micro_batches_of(int64_t steps) const;
  // A token dataset's tokens a sample (what throughput counts as tokens/s), 0 for images.
  int64_t sequence_length() const;
  // One training sample as the model sees it: [channels, height, width] after any resize, or [tokens].
  std::vector<int64_t> sample_shape() const;
  // The side of the images the model sees, 0 for tokens.
  int64_t image_size() const;
  // What happens to each split's samples on the way to the model, as the record's data_transforms says it.
  const nlohmann::json& transforms() const { return transforms_; }

 private:
  Options options_;
  data::Dataset train_set_, test_set_;
  std::unique_ptr<data::Loader> train_loader_, test_loader_;
  nlohmann::json transforms_;
  int64_t micro_batches_per_epoch_ = 0, steps_per_epoch_ = 0, epochs_ = 0, total_steps_ = 0;
};

}  // namespace ptrain::train
