#include "ptrain/config/batch_sizes.h"

#include "ptrain/core/error.h"

namespace ptrain::config {

namespace {

std::string described(const BatchKey& key) { return key.source + " " + std::to_string(*key.value); }

}  // namespace

BatchSizes resolve_batch_sizes(const BatchKey& train_batch, const BatchKey& micro_batch, const BatchKey& accumulation,
                               int64_t world_size) {
  check(world_size > 0, "batch sizes: the world size must be positive");
  for (const BatchKey* key : {&train_batch, &micro_batch, &accumulation}) {
    if (key->value) check(*key->value > 0, key->source + " must be positive, not " + std::to_string(*key->value));
  }
  const std::string world = "world size " + std::to_string(world_size);
  BatchSizes s;
  if (train_batch.value && micro_batch.value && accumulation.value) {
    s = {*micro_batch.value, *accumulation.value, *train_batch.value};
    check(s.train_batch == s.micro_batch * s.accumulation * world_size,
          described(train_batch) + " disagrees with " + described(micro_batch) + " x " + described(accumulation) +
              " x " + world + " = " + std::to_string(s.micro_batch * s.accumulation * world_size) +
              " (train_batch_size must be micro batch x accumulation x world size)");
  } else if (train_batch.value && micro_batch.value) {
    const int64_t per_step = *micro_batch.value * world_size;
    check(*train_batch.value % per_step == 0, described(train_batch) + " is not divisible by " +
                                                  described(micro_batch) + " x " + world);
    s = {*micro_batch.value, *train_batch.value / per_step, *train_batch.value};
  } else if (train_batch.value && accumulation.value) {
    const int64_t per_step = *accumulation.value * world_size;
    check(*train_batch.value % per_step == 0, described(train_batch) + " is not divisible by " +
                                                  described(accumulation) + " x " + world);
    s = {*train_batch.value / per_step, *accumulation.value, *train_batch.value};
  } else if (micro_batch.value && accumulation.value) {
    s = {*micro_batch.value, *accumulation.value, *micro_batch.value * *accumulation.value * world_size};
  } else if (train_batch.value) {
    check(*train_batch.value % world_size == 0, described(train_batch) + " is not divisible by the " + world);
    s = {*train_batch.value / world_size, 1, *train_batch.value};
  } else if (micro_batch.value) {
    s = {*micro_batch.value, 1, *micro_batch.value * world_size};
  } else {
    throw Error("train_batch_size or train_micro_batch_size_per_gpu is needed (" + accumulation.source +
                " alone does not give a batch size)");
  }
  return s;
}

}  // namespace ptrain::config
