// Batches for training and evaluation: a background thread gathers and ships uint8 images ahead of the consumer,
// the consumer augments them on the device. Token datasets pass through as int64, without augmentation.
// Streamed image folders (Dataset::source) are decoded by a pool of the source's threads, two batches at a
// time, each image already cropped (and, training, flipped) to its final size; the device then only
// normalises them.
#pragma once

#include <torch/torch.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "ptrain/data/augment.h"
#include "ptrain/data/dataset.h"
#include "ptrain/data/sampler.h"

namespace ptrain::data {

class CopyStream;  // copy_stream.h

struct LoaderOptions {
  int64_t batch_size = 128;
  bool shuffle = true;
  // Drops both the sampler's remainder across ranks and the last incomplete batch, as DataLoader(drop_last=True)
  // over DistributedSampler(drop_last=True). Without it the sampler pads ranks to equal counts by wrapping and the
  // last batch may be short.
  bool drop_last = false;
  uint64_t seed = 0;
  int64_t rank = 0, world_size = 1;
  torch::Device device = torch::kCPU;
  int64_t prefetch = 2;    // batches kept ready ahead of the consumer (at least 1)
  bool pin_memory = true;  // page-locked staging, so CUDA copies are asynchronous; ignored off CUDA
  AugmentOptions augment;
  bool train = true;  // false: no random crop or flip, only conversion, resize and normalisation
};

struct Batch {
  torch::Tensor images;  // augmented, on options.device, options.augment.out_dtype; token datasets: int64 [B, T] as stored
  torch::Tensor labels;  // int64 on options.device: [B], or [B, T] for tokens
  int64_t index;         // batch index in the epoch
};

class Loader {
 public:
  Loader(const Dataset& dataset, LoaderOptions options);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Starts (or restarts) producing `epoch` from batch first_batch on; batches are the same as those of an
  // uninterrupted epoch, which is what resuming mid-epoch relies on. Augmentation of batch b is drawn from
  // derive_seed(seed, {epoch, b, rank}).
  void start_epoch(int64_t epoch, int64_t first_batch = 0);

  // The next batch of the epoch, nullopt after the last. Waits for the worker; rethrows its errors. On CUDA the
  // batch is ready for use on the calling thread's current stream.
  std::optional<Batch> next();

  int64_t batches_per_epoch() const;
  int64_t samples_per_epoch() const;  // this rank's samples in an epoch, after dropping

  // Host seconds next() has spent waiting for a batch that was not ready yet, since construction: the time
  // the consumer waited for data.
  double wait_seconds() const { return wait_seconds_; }

 private:
  struct Pending;
  class DecodePool;

  void stop_worker();
  void produce(int64_t first_batch, std::vector<int64_t> order);
  void push(std::unique_ptr<Pending> item, bool wait_for_room);

  Dataset dataset_;
  LoaderOptions options_;
  DistributedSampler sampler_;
  std::unique_ptr<CopyStream> copy_stream_;  // CUDA devices only
  std::unique_ptr<DecodePool> pool_;  // streamed datasets only
  bool decode_augmented_ = false;     // streamed: random resized crops and flips at decode
  int64_t epoch_ = -1;
  bool epoch_finished_ = true;
  double wait_seconds_ = 0;

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::unique_ptr<Pending>> queue_;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace ptrain::data
