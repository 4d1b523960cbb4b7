#include "ptrain/config/settings_in_effect.h"

#include <utility>

#include "ptrain/core/error.h"
#include "ptrain/strategy_spec/strategy_spec.h"

namespace ptrain::config {

void refuse_settings_without_effect(const TrainConfig& c) {
  const TrainConfig defaults;
  const auto spec = strategies::StrategySpec::parse(c.run.strategy, c.sharding.fsdp_sharding);
  const std::string strategy = spec.name();
  const bool one_process = !spec.multi_process();
  const std::string under = " (this run's strategy is " + strategy + ")";

  if (!c.sharding.reduce_dtype.empty()) {
    check(!one_process, "--reduce-dtype: --strategy " + strategy +
                            (spec.drives_several_devices() ? " sums the replicas' gradients in their own dtype on the first device"
                                              : " reduces no gradients") +
                            "; it applies to ddp (gradient compression) and fsdp");
  }
  if (c.dist.bucket_cap_mb != defaults.dist.bucket_cap_mb) {
    check(spec.reduces_in_ddp_buckets(), "--bucket-cap-mb sizes ddp's gradient buckets" + under +
                                                      (spec.reduces_in_size_groups() ? "; use --reduce-bucket-mb" : ""));
  }
  if (c.sharding.reduce_bucket_mb != defaults.sharding.reduce_bucket_mb) {
    std::string why;
    if (spec.reduces_in_ddp_buckets()) why = "; ddp's buckets take --bucket-cap-mb";
    if (spec.needs_units()) why = "; it reduces the gradients of one unit at a time";
    check(spec.reduces_in_size_groups(),
          "--reduce-bucket-mb sizes the gradient groups of zero1, zero2 and fsdp no-shard" + under + why);
  }
  check(c.sharding.allgather_bucket_mb == defaults.sharding.allgather_bucket_mb,
        "--allgather-bucket-mb: ptrain all-gathers the updated parameters of each gradient group (sized by "
        "--reduce-bucket-mb) in one collective; there is no separate all-gather bucket to size");
  check(c.sharding.contiguous_gradients,
        "--no-contiguous-gradients: ptrain always copies gradients into one flat buffer a bucket or group; "
        "that cannot be turned off");
  check(c.sharding.overlap_comm || !one_process,
        "--no-overlap-comm: --strategy " + strategy + " has no gradient communication during backward to hold back");

  // An optimizer's and a schedule's own settings, given to another (as --milestones without --schedule step).
  const OptimizerConfig& o = c.optim;
  const std::string optimizer_is = " (this run's optimizer is " + o.name + ")";
  if (o.name != "sgd") {
    check(o.momentum == defaults.optim.momentum,
          "--momentum applies to --optimizer sgd" + optimizer_is + "; adamw's moments take --beta1 and --beta2");
    check(o.nesterov == defaults.optim.nesterov, "--nesterov applies to --optimizer sgd" + optimizer_is);
  }
  if (o.name != "adamw") {
    for (const auto& [given, flag] : {std::pair<bool, const char*>{o.beta1 != defaults.optim.beta1, "--beta1"},
                                      {o.beta2 != defaults.optim.beta2, "--beta2"},
                                      {o.eps != defaults.optim.eps, "--eps"}})
      check(!given, std::string(flag) + " applies to --optimizer adamw" + optimizer_is);
  }
  const std::string schedule_is = " (this run's schedule is " + o.schedule + ")";
  check(o.schedule == "step" || o.gamma == defaults.optim.gamma, "--gamma applies to --schedule step" + schedule_is);
  check(o.schedule == "cosine" || o.schedule == "WarmupCosineLR" || o.min_lr == defaults.optim.min_lr,
        "--min-lr applies to --schedule cosine or WarmupCosineLR" + schedule_is);
  // ptrain's own schedules warm up linearly from 0: a log warm-up or a floor given to them would not act.
  const bool deepspeed_schedule = o.schedule.rfind("Warmup", 0) == 0;
  check(deepspeed_schedule || o.warmup_type == defaults.optim.warmup_type,
        "--warmup-type " + o.warmup_type + " applies to --schedule WarmupLR, WarmupDecayLR or WarmupCosineLR" + schedule_is);
  check(deepspeed_schedule || o.warmup_min_lr == defaults.optim.warmup_min_lr,
        "--warmup-min-lr applies to --schedule WarmupLR, WarmupDecayLR or WarmupCosineLR" + schedule_is);
}

}  // namespace ptrain::config
