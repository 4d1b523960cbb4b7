#include "ptrain/config/config_overlay.h"

#include <cmath>
#include <type_traits>

#include "ptrain/config/number_checks.h"
#include "ptrain/core/error.h"

namespace ptrain::config {

namespace {

std::string value_text(const std::string& value) { return value; }
std::string value_text(bool value) { return value ? "true" : "false"; }
std::string value_text(double value) { return exact_number_text(value); }
std::string value_text(int64_t value) { return std::to_string(value); }

// The bounds the flag's own validator (config/cli_options.cpp) sets: a value from a file meets them too.
struct Range {
  double low;
  bool low_inclusive;
  double high;
};
constexpr Range kPositive{0.0, false, INFINITY};
constexpr Range kNonNegative{0.0, true, INFINITY};
constexpr Range kFraction{0.0, true, 1.0};
// Settings LibTorch holds as floats.
constexpr Range kPositiveFloat{0.0, false, kFloatMax};
constexpr Range kNonNegativeFloat{0.0, true, kFloatMax};

class OverlayMerge {
 public:
  OverlayMerge(const ConfigOverlay& overlay, TrainConfig& config, const FlagsGiven& given)
      : overlay_(overlay), config_(config), given_(given), warnings_(overlay.warnings) {}

  std::vector<std::string> merge(int64_t world_size) {
    const ConfigOverlay& o = overlay_;
    TrainConfig& c = config_;
    take(o.reduce_dtype, "reduce-dtype", c.sharding.reduce_dtype);
    take(o.clip_grad_norm, "clip-grad-norm", c.optim.clip_grad_norm, kNonNegativeFloat);

    take(o.precision, "precision", c.precision.precision);
    take(o.master_weights, "master-weights", c.precision.master_weights);
    take(o.loss_scale, "loss-scale", c.precision.loss_scale);
    take(o.initial_loss_scale, "initial-loss-scale", c.precision.initial_loss_scale, kPositiveFloat);
    take(o.loss_scale_window, "loss-scale-window", c.precision.loss_scale_window, kPositive);
    take(o.hysteresis, "hysteresis", c.precision.hysteresis, kPositive);
    take(o.consecutive_hysteresis, "consecutive-hysteresis", c.precision.consecutive_hysteresis);
    take(o.min_loss_scale, "min-loss-scale", c.precision.min_loss_scale, kNonNegativeFloat);

    take(o.strategy, "strategy", c.run.strategy);
    take(o.offload_optimizer, "offload-optimizer", c.sharding.offload_optimizer);
    take(o.offload_params, "offload-params", c.sharding.offload_params);
    take(o.bucket_cap_mb, "bucket-cap-mb", c.dist.bucket_cap_mb, kPositive);
    take(o.reduce_bucket_mb, "reduce-bucket-mb", c.sharding.reduce_bucket_mb, kPositive);
    take(o.overlap_comm, "overlap-comm", c.sharding.overlap_comm);

    take(o.optimizer, "optimizer", c.optim.name);
    take(o.lr, "lr", c.optim.lr, kPositiveFloat);
    take(o.weight_decay, "weight-decay", c.optim.weight_decay, kNonNegativeFloat);
    take(o.beta1, "beta1", c.optim.beta1, kFraction);
    take(o.beta2, "beta2", c.optim.beta2, kFraction);
    take(o.eps, "eps", c.optim.eps, kPositiveFloat);
    take(o.momentum, "momentum", c.optim.momentum, kFraction);
    take(o.nesterov, "nesterov", c.optim.nesterov);
    take(o.warmup_steps, "warmup-steps", c.optim.warmup_steps, kNonNegative);
    take(o.warmup_epochs, "warmup-epochs", c.optim.warmup_epochs, kNonNegative);
    take(o.schedule, "schedule", c.optim.schedule);
    take(o.warmup_type, "warmup-type", c.optim.warmup_type);
    take(o.warmup_min_lr, "warmup-min-lr", c.optim.warmup_min_lr, kNonNegativeFloat);
    take(o.max_steps, "max-steps", c.run.max_steps, kNonNegative);
    if (o.min_lr_ratio && !given("min-lr")) c.optim.min_lr = c.optim.lr * *o.min_lr_ratio;
    if (o.warmup_min_ratio && !given("warmup-min-lr")) c.optim.warmup_min_lr = c.optim.lr * *o.warmup_min_ratio;

    if (o.batch.any) merge_batch(world_size);
    for (const AutoKey& a : o.auto_keys) {
      warnings_.push_back(where(a.key) + " is \"auto\": " +
                          (a.flag.empty() ? a.value
                                          : "--" + a.flag + " " + flag_value(a.flag, world_size) +
                                                (given(a.flag) || a.flag == "global-batch-size" ? "" : " (ptrain's default)")));
    }
    return warnings_;
  }

 private:
  bool given(const std::string& flag) const { return given_.count(flag) > 0; }

  // The value of a flag an "auto" key takes, once every source is merged.
  std::string flag_value(const std::string& flag, int64_t world_size) const {
    const TrainConfig& c = config_;
    if (flag == "lr") return value_text(c.optim.lr);
    if (flag == "weight-decay") return value_text(c.optim.weight_decay);
    if (flag == "beta1") return value_text(c.optim.beta1);
    if (flag == "beta2") return value_text(c.optim.beta2);
    if (flag == "eps") return value_text(c.optim.eps);
    if (flag == "momentum") return value_text(c.optim.momentum);
    if (flag == "nesterov") return value_text(c.optim.nesterov);
    if (flag == "clip-grad-norm") return value_text(c.optim.clip_grad_norm) + (c.optim.clip_grad_norm > 0 ? "" : " (off)");
    if (flag == "warmup-steps")
      return c.optim.warmup_steps > 0 || c.optim.warmup_epochs == 0
                 ? value_text(c.optim.warmup_steps)
                 : value_text(c.optim.warmup_steps) + " (--warmup-epochs " + value_text(c.optim.warmup_epochs) + ")";
    if (flag == "warmup-type") return c.optim.warmup_type;
    if (flag == "warmup-min-lr") return value_text(c.optim.warmup_min_lr);
    if (flag == "max-steps")
      return value_text(c.run.max_steps) + (c.run.max_steps > 0 ? "" : " (the run's --epochs " + value_text(c.run.epochs) + ")");
    if (flag == "batch-size") return value_text(c.run.batch_size);
    if (flag == "grad-accum") return value_text(c.optim.grad_accum);
    if (flag == "global-batch-size")
      return value_text(c.run.batch_size * c.optim.grad_accum * world_size) + " (--batch-size x --grad-accum x " +
             value_text(world_size) + " processes)";
    if (flag == "precision") return c.precision.precision;
    if (flag == "bucket-cap-mb") return value_text(c.dist.bucket_cap_mb);
    if (flag == "reduce-bucket-mb") return value_text(c.sharding.reduce_bucket_mb);
    if (flag == "overlap-comm") return value_text(c.sharding.overlap_comm);
    throw Error("config overlay: no value for \"auto\" of --" + flag);
  }
  std::string where(const std::string& key) const { return overlay_.source + ": key '" + key + "'"; }

  // The file's value where no earlier source gave the flag; else the earlier one stays, named when it
  // replaces a value the file writes.
  template <class T>
  void take(const Overlaid<T>& from_file, const std::string& flag, T& field, std::optional<Range> range = {}) {
    if (!from_file) return;
    if (given(flag)) {
      if (from_file->named_by_file && field != from_file->value) {
        warnings_.push_back(where(from_file->key) + " (" + value_text(from_file->value) + ") is overridden by --" +
                            flag + " " + value_text(field) + " from the command line, PTRAIN_* or --config");
      }
      return;
    }
    if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
      if (range) {
        const double value = static_cast<double>(from_file->value);
        const std::string problem =
            range_problem(value, value_text(from_file->value), range->low, range->low_inclusive, range->high);
        check(problem.empty(), where(from_file->key) + ": --" + flag + ": " + problem);
      }
    }
    field = from_file->value;
  }

  // Flags and --config keys win over the file's batch keys; "auto" takes ptrain's value.
  void merge_batch(int64_t world_size) {
    BatchKeysOfFile b = overlay_.batch;
    TrainConfig& c = config_;
    if (given("batch-size") || b.micro_auto) overridden_batch(b.micro_batch, "batch-size", c.run.batch_size, b.micro_auto);
    if (given("grad-accum") || b.accumulation_auto)
      overridden_batch(b.accumulation, "grad-accum", c.optim.grad_accum, b.accumulation_auto);
    if (given("global-batch-size") && c.run.global_batch_size > 0)
      overridden_batch(b.train_batch, "global-batch-size", c.run.global_batch_size, false);
    if (!b.micro_batch.value && !b.train_batch.value) {
      b.micro_batch = {c.run.batch_size, "--batch-size"};  // ptrain's own micro batch
    }
    try {
      const BatchSizes sizes = resolve_batch_sizes(b.train_batch, b.micro_batch, b.accumulation, world_size);
      c.run.batch_size = sizes.micro_batch;
      c.optim.grad_accum = sizes.accumulation;
      c.run.global_batch_size = 0;  // resolved here: batch_size and grad_accum say it all
    } catch (const Error& e) {
      throw Error(overlay_.source + ": " + e.what());
    }
  }

  void overridden_batch(BatchKey& key, const std::string& flag, int64_t value, bool file_said_auto) {
    if (key.value && *key.value != value)
      warnings_.push_back(where(key.source) + " (" + std::to_string(*key.value) + ") is overridden by --" + flag +
                          " " + std::to_string(value));
    key.value = value;
    key.source = file_said_auto && !given(flag) ? key.source + " (\"auto\": --" + flag + ")" : "--" + flag;
  }

  const ConfigOverlay& overlay_;
  TrainConfig& config_;
  const FlagsGiven& given_;
  std::vector<std::string> warnings_;
};

}  // namespace

std::vector<std::string> apply_overlay(const ConfigOverlay& overlay, TrainConfig& config, const FlagsGiven& given,
                                       int64_t world_size) {
  return OverlayMerge(overlay, config, given).merge(world_size);
}

}  // namespace ptrain::config
