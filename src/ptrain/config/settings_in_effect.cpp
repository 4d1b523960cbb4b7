#include "ptrain/config/settings_in_effect.h"

#include "ptrain/core/error.h"

namespace ptrain::config {

void refuse_settings_without_effect(const TrainConfig& c) {
  const TrainConfig defaults;
  const std::string& strategy = c.run.strategy;
  const bool zero12 = strategy == "zero1" || strategy == "zero2";
  const bool fsdp_no_shard = strategy == "fsdp" && c.sharding.fsdp_sharding == "no-shard";
  const bool one_process = strategy == "single" || strategy == "dp";
  const std::string under = " (this run's strategy is " + strategy + ")";

  if (!c.sharding.reduce_dtype.empty()) {
    check(!one_process, "--reduce-dtype: --strategy " + strategy +
                            (strategy == "dp" ? " sums the replicas' gradients in their own dtype on the first device"
                                              : " reduces no gradients") +
                            "; it applies to ddp (gradient compression) and fsdp");
  }
  if (c.dist.bucket_cap_mb != defaults.dist.bucket_cap_mb) {
    check(strategy == "ddp", "--bucket-cap-mb sizes ddp's gradient buckets" + under +
                                 (zero12 || fsdp_no_shard ? "; use --reduce-bucket-mb" : ""));
  }
  if (c.sharding.reduce_bucket_mb != defaults.sharding.reduce_bucket_mb) {
    std::string why;
    if (strategy == "ddp") why = "; ddp's buckets take --bucket-cap-mb";
    if (strategy == "zero3" || strategy == "fsdp") why = "; it reduces the gradients of one unit at a time";
    check(zero12 || fsdp_no_shard,
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
}

}  // namespace ptrain::config
