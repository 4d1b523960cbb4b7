#include "ptrain/data/loader.h"

#include <chrono>

#include "ptrain/core/error.h"
#include "ptrain/core/rng.h"
#include "ptrain/data/copy_stream.h"

namespace ptrain::data {

// Threads decoding the samples of streamed batches. A batch is `count` independent tasks; the producer
// starts the next batch before waiting for this one, so the pool never idles at a batch's tail.
class Loader::DecodePool {
 public:
  class Batch {
   public:
    Batch(int64_t count, std::function<void(int64_t)> work) : work_(std::move(work)), remaining_(count), errors_(count) {}
    // Blocks until every task ran; rethrows the error of the first sample (in batch order) that failed.
    void wait() {
      std::unique_lock<std::mutex> lock(mutex_);
      done_.wait(lock, [&] { return remaining_ == 0; });
      for (const auto& e : errors_) {
        if (e) std::rethrow_exception(e);
      }
    }

   private:
    friend class DecodePool;
    void run(int64_t k) {
      try {
        work_(k);
      } catch (...) {
        errors_[static_cast<size_t>(k)] = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mutex_);
      if (--remaining_ == 0) done_.notify_all();
    }

    std::function<void(int64_t)> work_;
    std::mutex mutex_;
    std::condition_variable done_;
    int64_t remaining_;
    std::vector<std::exception_ptr> errors_;
  };

  explicit DecodePool(int threads) {
    for (int t = 0; t < std::max(threads, 1); ++t) threads_.emplace_back([this] { loop(); });
  }
  ~DecodePool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }

  std::shared_ptr<Batch> start(int64_t count, std::function<void(int64_t)> work) {
    auto batch = std::make_shared<Batch>(count, std::move(work));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (int64_t k = 0; k < count; ++k) tasks_.emplace_back(batch, k);
    }
    wake_.notify_all();
    return batch;
  }

 private:
  void loop() {
    while (true) {
      std::pair<std::shared_ptr<Batch>, int64_t> task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
        if (tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task.first->run(task.second);
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::pair<std::shared_ptr<Batch>, int64_t>> tasks_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

// One batch on its way from the worker to the consumer: the data, or the end of the epoch, or the worker's error.
struct Loader::Pending {
  torch::Tensor images;  // uint8 images or int64 tokens, already on the target device
  torch::Tensor labels;
  int64_t index = 0;
  bool end = false;
  std::exception_ptr error;
  std::unique_ptr<CopyFence> copied;  // on the copy stream, after the host-to-device copy
};

Loader::Loader(const Dataset& dataset, LoaderOptions options)
    : dataset_(dataset),
      options_(std::move(options)),
      sampler_(dataset.size(), options_.rank, options_.world_size, options_.shuffle, options_.seed, options_.drop_last) {
  if (dataset_.is_streamed()) {
    check(dataset_.labels.defined() && dataset_.labels.dim() == 1 && dataset_.labels.scalar_type() == torch::kInt64,
          "loader: streamed dataset '" + dataset_.description + "' needs int64 labels, one a sample");
    // Crops, flips and the final size are made at decode: the device only converts and normalises.
    decode_augmented_ = options_.train && (options_.augment.random_crop || options_.augment.horizontal_flip);
    options_.augment.random_crop = false;
    options_.augment.horizontal_flip = false;
    options_.augment.resize = 0;
    pool_ = std::make_unique<DecodePool>(dataset_.source->threads());
  } else if (dataset_.is_tokens()) {
    check(dataset_.images.dim() == 2 && dataset_.labels.defined() && dataset_.labels.sizes() == dataset_.images.sizes() &&
              dataset_.labels.scalar_type() == torch::kInt64,
          "loader: token dataset '" + dataset_.description + "' needs int64 N x T inputs and labels of the same shape");
  } else {
    check(dataset_.images.defined() && dataset_.images.dim() == 4 && dataset_.images.scalar_type() == torch::kUInt8,
          "loader: dataset '" + dataset_.description + "' images must be uint8 N x C x H x W (or int64 N x T tokens)");
  }
  check(dataset_.is_streamed() || dataset_.images.size(0) == dataset_.size(),
        "loader: dataset '" + dataset_.description + "' has " +
            std::to_string(dataset_.is_streamed() ? 0 : dataset_.images.size(0)) + " images but " +
            std::to_string(dataset_.size()) + " labels");
  check(options_.batch_size >= 1, "loader: batch_size must be >= 1, got " + std::to_string(options_.batch_size));
  check(options_.prefetch >= 1, "loader: prefetch must be >= 1, got " + std::to_string(options_.prefetch));
  if (dataset_.images.defined()) dataset_.images = dataset_.images.contiguous();
  dataset_.labels = dataset_.labels.contiguous();
  if (options_.device.is_cuda()) {
    copy_stream_ = make_copy_stream(options_.device);
    options_.device = copy_stream_->device();
  }
}

Loader::~Loader() { stop_worker(); }

int64_t Loader::batches_per_epoch() const {
  const int64_t n = sampler_.num_samples();
  return options_.drop_last ? n / options_.batch_size : (n + options_.batch_size - 1) / options_.batch_size;
}

int64_t Loader::samples_per_epoch() const {
  return options_.drop_last ? batches_per_epoch() * options_.batch_size : sampler_.num_samples();
}

void Loader::stop_worker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  if (worker_.joinable()) worker_.join();
  std::lock_guard<std::mutex> lock(mutex_);
  queue_.clear();
  stop_ = false;
}

void Loader::start_epoch(int64_t epoch, int64_t first_batch) {
  check(epoch >= 0, "loader: epoch must be >= 0, got " + std::to_string(epoch));
  check(first_batch >= 0 && first_batch <= batches_per_epoch(),
        "loader: first_batch " + std::to_string(first_batch) + " outside 0.." + std::to_string(batches_per_epoch()));
  stop_worker();
  epoch_ = epoch;
  epoch_finished_ = false;
  worker_ = std::thread(&Loader::produce, this, first_batch, sampler_.indices(epoch));
}

void Loader::push(std::unique_ptr<Pending> item, bool wait_for_room) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (wait_for_room) {
    changed_.wait(lock, [&] { return stop_ || static_cast<int64_t>(queue_.size()) < options_.prefetch; });
  }
  if (stop_) return;
  queue_.push_back(std::move(item));
  changed_.notify_all();
}

void Loader::produce(int64_t first_batch, std::vector<int64_t> order) {
  try {
    const bool to_cuda = options_.device.is_cuda();
    const bool pin = to_cuda && options_.pin_memory;
    // Copies and allocations below happen on the copy stream.
    const std::shared_ptr<void> on_copy_stream = to_cuda ? copy_stream_->make_current() : nullptr;
    const auto& images = dataset_.images;
    const int64_t samples = samples_per_epoch();
    // A batch on its way: its host tensors and, streamed, the decoding that fills its images.
    struct Gathered {
      int64_t b = 0;
      torch::Tensor images, labels;
      std::shared_ptr<DecodePool::Batch> decode;
    };
    const auto gather = [&](int64_t b) {
      Gathered g;
      g.b = b;
      const int64_t begin = b * options_.batch_size;
      const int64_t count = std::min(options_.batch_size, samples - begin);
      auto index = torch::from_blob(order.data() + begin, {count}, torch::kInt64);
      auto host_options = torch::TensorOptions().pinned_memory(pin);
      // Images: uint8 [count, C, H, W] and labels [count]; tokens: int64 [count, T] both.
      std::vector<int64_t> label_shape = dataset_.labels.sizes().vec();
      label_shape[0] = count;
      g.labels = torch::empty(label_shape, host_options.dtype(torch::kInt64));
      torch::index_select_out(g.labels, dataset_.labels, 0, index);
      if (!dataset_.is_streamed()) {
        std::vector<int64_t> image_shape = images.sizes().vec();
        image_shape[0] = count;
        g.images = torch::empty(image_shape, host_options.dtype(images.scalar_type()));
        torch::index_select_out(g.images, images, 0, index);
        return g;
      }
      g.images = torch::empty({count, dataset_.channels(), dataset_.height(), dataset_.width()},
                              host_options.dtype(torch::kUInt8));
      const ImageSource* source = dataset_.source.get();
      uint8_t* out = g.images.data_ptr<uint8_t>();
      const int64_t sample_bytes = g.images[0].numel();
      const int64_t* batch_samples = order.data() + begin;
      const auto epoch = static_cast<uint64_t>(epoch_);
      const bool augment = decode_augmented_;
      const uint64_t seed = options_.seed;
      // Each sample's crop and flip come from (seed, epoch, sample) alone: the same on any thread count.
      g.decode = pool_->start(count, [=](int64_t k) {
        const int64_t sample = batch_samples[k];
        source->decode(sample, augment, derive_seed(seed, {0x5354524541ull, epoch, static_cast<uint64_t>(sample)}),
                       out + k * sample_bytes);
      });
      return g;
    };
    // Streamed batches decoding, two at a time so that the pool never idles at a batch's tail. Their tasks
    // use this frame's order and host tensors: each is waited for before the frame unwinds.
    std::deque<Gathered> decoding;
    struct WaitAll {
      std::deque<Gathered>& batches;
      ~WaitAll() {
        for (auto& g : batches) {
          try {
            g.decode->wait();
          } catch (...) {
          }
        }
      }
    } wait_all{decoding};

    int64_t next = first_batch;  // the next batch to gather
    while (true) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (stop_) return;
      }
      Gathered ready;
      if (dataset_.is_streamed()) {
        while (next < batches_per_epoch() && decoding.size() < 2) decoding.push_back(gather(next++));
        if (decoding.empty()) break;
        ready = std::move(decoding.front());
        decoding.pop_front();
        ready.decode->wait();
      } else {
        if (next >= batches_per_epoch()) break;
        ready = gather(next++);
      }
      const torch::Tensor& host_images = ready.images;
      const torch::Tensor& host_labels = ready.labels;
      const int64_t shipped = ready.b;

      auto item = std::make_unique<Pending>();
      item->index = shipped;
      if (options_.device.is_cpu()) {
        item->images = host_images;
        item->labels = host_labels;
      } else {
        item->images = host_images.to(options_.device, /*non_blocking=*/true);
        item->labels = host_labels.to(options_.device, /*non_blocking=*/true);
        if (to_cuda) item->copied = copy_stream_->fence();
      }
      push(std::move(item), /*wait_for_room=*/true);
    }
    auto end = std::make_unique<Pending>();
    end->end = true;
    push(std::move(end), /*wait_for_room=*/false);
  } catch (...) {
    auto failed = std::make_unique<Pending>();
    failed->error = std::current_exception();
    push(std::move(failed), /*wait_for_room=*/false);
  }
}

std::optional<Batch> Loader::next() {
  check(epoch_ >= 0, "loader: next() called before start_epoch()");
  if (epoch_finished_) return std::nullopt;
  std::unique_ptr<Pending> item;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (queue_.empty()) {
      const auto waiting_since = std::chrono::steady_clock::now();
      changed_.wait(lock, [&] { return !queue_.empty(); });
      wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - waiting_since).count();
    }
    item = std::move(queue_.front());
    queue_.pop_front();
  }
  changed_.notify_all();
  if (item->error) {
    epoch_finished_ = true;
    std::rethrow_exception(item->error);
  }
  if (item->end) {
    epoch_finished_ = true;
    return std::nullopt;
  }

  if (item->copied) item->copied->hand_over({item->images, item->labels});

  Batch batch;
  batch.index = item->index;
  batch.labels = item->labels;
  if (dataset_.is_tokens()) {
    // Token ids stay int64: there is nothing to augment, and casting them to the compute dtype would corrupt them.
    batch.images = item->images;
  } else if (options_.train) {
    const auto seed = derive_seed(options_.seed, {static_cast<uint64_t>(epoch_), static_cast<uint64_t>(item->index),
                                                  static_cast<uint64_t>(options_.rank)});
    const auto draw = draw_augmentation(item->images.size(0), options_.augment, seed);
    batch.images = augment_batch(item->images, options_.augment, &draw);
  } else {
    batch.images = augment_batch(item->images, options_.augment, nullptr);
  }
  return batch;
}

}  // namespace ptrain::data
