// DeepSpeed's three batch numbers (train_batch_size = micro batch x accumulation x world size) and the
// rule that derives the ones a ds_config leaves out from those it gives.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ptrain::config {

// One of train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps: its value
// (none: absent, or "auto" for train_batch_size) and what gave it (a key or a flag, for errors).
struct BatchKey {
  std::optional<int64_t> value;
  std::string source;
};

struct BatchSizes {
  int64_t micro_batch = 0;   // per device per micro-step
  int64_t accumulation = 0;  // micro-steps per optimizer step
  int64_t train_batch = 0;   // micro_batch x accumulation x world_size
};

// DeepSpeed's rule: the missing ones of the three follow from those given (accumulation 1 when only a
// batch size is given). All three given and disagreeing, or a division that does not come out whole,
// is a ptrain::Error naming the keys and the numbers.
BatchSizes resolve_batch_sizes(const BatchKey& train_batch, const BatchKey& micro_batch, const BatchKey& accumulation,
                               int64_t world_size);

}  // namespace ptrain::config
