#include "ptrain/estimate/run_length.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>

#include "ptrain/core/error.h"
#include "ptrain/data/registry.h"
#include "ptrain/data/sampler.h"
#include "ptrain/train/schedule.h"

namespace ptrain::estimate {

namespace {

std::string number_text(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

}  // namespace

RunLength run_length(const train::RunLength& run, const train::ScheduleOptions& schedule, int64_t train_samples,
                     int64_t processes, int64_t replicas) {
  // The trainer's load_data: each process's loader takes batch x replicas samples a step from its share.
  const int64_t loader_batch = run.batch_size * replicas;
  check(train_samples >= loader_batch, "--batch-size " + std::to_string(run.batch_size) + " x " +
                                           std::to_string(replicas) + " replicas is larger than the " +
                                           std::to_string(train_samples) + " training samples");
  const data::DistributedSampler share(train_samples, 0, processes, /*shuffle=*/false, 0, /*drop_last=*/true);
  RunLength length;
  const int64_t micro_batches = share.num_samples() / loader_batch;
  check(micro_batches >= run.grad_accum, "--grad-accum " + std::to_string(run.grad_accum) + " x --batch-size " +
                                             std::to_string(run.batch_size) + " is more than one epoch of data (" +
                                             std::to_string(share.num_samples()) + " samples per process)");
  const train::RunSteps steps = train::run_steps(run, micro_batches);
  length.steps_per_epoch = steps.steps_per_epoch;
  length.total_steps = steps.total_steps;
  length.warmup_steps = schedule.warmup_steps > 0
                            ? schedule.warmup_steps
                            : static_cast<int64_t>(std::llround(schedule.warmup_epochs *
                                                                static_cast<double>(length.steps_per_epoch)));
  if (length.warmup_steps > length.total_steps) {
    const std::string warmup = schedule.warmup_steps > 0
                                   ? "--warmup-steps " + std::to_string(schedule.warmup_steps)
                                   : "--warmup-epochs " + number_text(schedule.warmup_epochs) + " is " +
                                         std::to_string(length.warmup_steps) + " optimizer steps (" +
                                         std::to_string(length.steps_per_epoch) + " an epoch), which";
    const bool capped = run.max_steps > 0;
    throw Error(warmup + " is longer than the whole run of " + std::to_string(length.total_steps) + " steps (" +
                (capped ? "--max-steps " + std::to_string(run.max_steps)
                        : "--epochs " + std::to_string(run.epochs)) +
                "): shorten the warm-up (warmup-epochs, or warmup-steps with warmup-epochs 0) or lengthen the run");
  }
  // The schedule has the last word: whatever else it refuses, the run would refuse too.
  const train::LrSchedule lr_schedule(schedule, length.steps_per_epoch, std::max<int64_t>(length.total_steps, 1));
  (void)lr_schedule;
  return length;
}

int64_t training_samples(const data::DataSpec& data, const train::DataOptions& options) {
  const data::DataSpec spec = data::resolve_image_loading(data);
  const int threads = static_cast<int>(std::max<int64_t>(1, options.loader_threads));
  std::optional<int64_t> n;
  if (spec.image_loading == "memory") {
    // An image folder loaded whole holds the images its listing names; listing it, as streaming opens it,
    // counts them without decoding every one. CIFAR-10's binary release is not a folder: read below.
    data::DataSpec listed = spec;
    listed.image_loading = "stream";
    listed.image_size = std::max<int64_t>(1, spec.image_size);
    try {
      n = data::open_dataset(listed, /*train=*/true, threads).size();
    } catch (const Error&) {
    }
  }
  if (!n) n = data::open_dataset(spec, /*train=*/true, threads).size();
  return options.train_limit > 0 ? std::min(*n, options.train_limit) : *n;
}

}  // namespace ptrain::estimate
