#include "ptrain/train/checkpointer.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <set>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <numeric>
#include <optional>
#include <random>
#include <utility>

#include "ptrain/core/error.h"
#include "ptrain/io/atomic_file.h"
#include "ptrain/metrics/timer.h"
#include "ptrain/train/checkpoint_staging.h"

namespace ptrain::train {

namespace fs = std::filesystem;

namespace {

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "unknown host";
  return name;
}

// "pid 1234 on node7", as the holder wrote it; what is there even when it cannot be read whole.
std::string holder_of(const std::string& lock_path) {
  try {
    std::string text = io::read_file_bytes(lock_path);
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    return text.empty() ? "a run that has not yet written its name" : text;
  } catch (const Error&) {
    return "another run";
  }
}

std::string random_run_id() {
  std::random_device random;
  char text[17];
  std::snprintf(text, sizeof text, "%08x%08x", random(), random());
  return text;
}

// What the writer waits on before it reads a span of a staged checkpoint's bytes, its waits added to waited
// (thread-seconds, from several threads at once).
std::function<void(std::string_view)> arrived_bytes(const StagedSections& staged, std::atomic<double>& waited) {
  return [&staged, &waited](std::string_view bytes) {
    const metrics::Stopwatch clock;
    staged.wait_until_copied(bytes.data());
    for (double seen = waited.load(); !waited.compare_exchange_weak(seen, seen + clock.elapsed_seconds());) {
    }
  };
}

// A test seam's whole number from the environment, at least minimum; none when unset. Refused naming the
// variable otherwise.
std::optional<int64_t> test_seam(const char* variable, int64_t minimum, const std::string& unit) {
  const char* text = std::getenv(variable);
  if (text == nullptr) return std::nullopt;
  char* end = nullptr;
  const int64_t value = std::strtoll(text, &end, 10);
  check(*text != '\0' && *end == '\0' && value >= minimum, std::string(variable) + "=" + text + ": expected " + unit +
                                                             ", a whole number >= " + std::to_string(minimum));
  return value;
}

}  // namespace

Checkpointer::Checkpointer(CheckpointerOptions options) : options_(std::move(options)) {
  if (options_.async) test_delay_ms_ = test_seam(kTestWriteDelayVariable, 0, "milliseconds").value_or(0);
  part_bytes_ = test_seam(kTestPartBytesVariable, 1, "bytes").value_or(kCheckpointPartBytes);
  if (!options_.owner) return;
  fs::create_directories(options_.dir);
  lock();
  try {
    refuse_or_remove_other_runs_checkpoints();
    lineage_.run_id = random_run_id();
    if (!options_.resumed_from.empty()) {
      const CheckpointHeader parent = read_checkpoint_header(options_.resumed_from);
      lineage_.parent_run_id = parent.lineage.run_id;
      lineage_.parent_step = parent.global_step;
      lineage_.parent_file = fs::path(options_.resumed_from).filename().string();
    }
    // Only this run writes here while it holds the lock: the sequence read now stays the highest.
    lineage_.sequence = highest_sequence(options_.dir);
    // Only now, holding the lock, is every temporary file here a leftover: a live run's write in progress
    // would be in a directory that run holds.
    const int64_t stale = remove_stale_temporaries(options_.dir);
    if (stale > 0)
      std::cout << "removed " << stale << " file(s) left by interrupted checkpoint writes in " << options_.dir
                << std::endl;
  } catch (...) {
    ::close(lock_fd_);
    lock_fd_ = -1;
    throw;
  }
}

Checkpointer::~Checkpointer() {
  // A run ending on an error lets the write in flight finish: it holds a state that trained, and a
  // process that exits with it half written would leave only the previous checkpoint. Its own error, if
  // any, comes second to the one ending the run.
  if (worker_.joinable()) worker_.join();
  if (pruner_.joinable()) pruner_.join();
  // Closing releases the lock. The file stays: removing it would let a run that opened it a moment before
  // lock a file no longer in the directory while a third run creates and locks a new one.
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

// flock, not a pid file: the kernel drops the lock when the process dies, so a killed run never leaves a
// directory locked, and no pid can be mistaken for a live run after a reboot or on another node. flock
// locks open files, so two runs in one process (the library API's) exclude each other too.
void Checkpointer::lock() {
  const std::string path = (fs::path(options_.dir) / kCheckpointLockFile).string();
  lock_fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  check(lock_fd_ >= 0, "--checkpoint-dir " + options_.dir + ": cannot open its lock file " + path + ": " +
                           std::strerror(errno));
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    ::close(lock_fd_);
    lock_fd_ = -1;
    check(error == EWOULDBLOCK, "--checkpoint-dir " + options_.dir + ": cannot lock " + path + ": " +
                                    std::strerror(error));
    throw Error("--checkpoint-dir " + options_.dir + " is in use by another run (" + holder_of(path) +
                "): two runs writing one directory would mix and delete each other's checkpoints; wait for it "
                "to end or choose another directory");
  }
  const std::string holder = "pid " + std::to_string(::getpid()) + " on " + host_name() + "\n";
  if (::ftruncate(lock_fd_, 0) == 0) {
    // Who holds it is for the message above only; the lock works without it.
    [[maybe_unused]] const ssize_t written = ::pwrite(lock_fd_, holder.data(), holder.size(), 0);
  }
}

void Checkpointer::refuse_or_remove_other_runs_checkpoints() {
  if (!options_.resumed_from.empty()) return;  // continuing the run whose checkpoints these are
  const auto found = list_checkpoints(options_.dir);
  if (found.empty()) return;
  const std::string what = std::to_string(found.size()) + " checkpoint(s) of another run, the newest " + found.back();
  check(options_.overwrite, "--checkpoint-dir " + options_.dir + " holds " + what +
                                ": continue that run with --resume latest, start over with --overwrite-checkpoints "
                                "(which removes them), or choose another directory");
  // Removed rather than left: kept, --keep-checkpoints would count them and --resume latest could pick an
  // old run's checkpoint with a higher step over this run's newest.
  for (const auto& path : found) remove_checkpoint(path);
  std::cout << "removed " << what << " in " << options_.dir << " (--overwrite-checkpoints)" << std::endl;
}

namespace {

// A checkpoint's tensors, section by section, in the order put_sections() takes them back.
std::vector<io::NamedTensors> take_sections(Checkpoint& checkpoint) {
  std::vector<io::NamedTensors> sections;
  for (auto* section : {&checkpoint.model, &checkpoint.optimizer, &checkpoint.scaler, &checkpoint.progress})
    sections.push_back(std::move(*section));
  return sections;
}

void put_sections(Checkpoint& checkpoint, std::vector<io::NamedTensors> sections) {
  checkpoint.model = std::move(sections.at(0));
  checkpoint.optimizer = std::move(sections.at(1));
  checkpoint.scaler = std::move(sections.at(2));
  checkpoint.progress = std::move(sections.at(3));
}

}  // namespace

PendingWrite Checkpointer::take(const std::string& path, Checkpoint checkpoint) {
  PendingWrite pending;
  pending.path = path;
  if (options_.async) {
    wait();
    pending.staged = stage(take_sections(checkpoint));
  }
  pending.checkpoint = std::move(checkpoint);
  return pending;
}

PendingWrite Checkpointer::take_shard(const std::string& path, int64_t rank, int64_t ranks,
                                      const io::NamedTensors& shards, const nlohmann::json& layout) {
  PendingWrite pending;
  pending.path = path;
  if (options_.async) {
    wait();
    pending.staged = stage({shards});
  }
  // Async: the staged copies are what is written, not the tensors the next steps change.
  pending.shard = PendingWrite::Shard{rank, ranks, options_.async ? io::NamedTensors{} : shards, layout};
  return pending;
}

void Checkpointer::write(PendingWrite pending) {
  if (pending.shard) {
    write_shard_file(std::move(pending));
    return;
  }
  Checkpoint checkpoint = std::move(*pending.checkpoint);
  const std::string path = pending.path;
  checkpoint.lineage = lineage_;
  checkpoint.lineage.sequence = lineage_.sequence + 1;
  if (!options_.async) {
    put_sections(checkpoint, copy_to_pinned_host(take_sections(checkpoint), *host_area_));
    save_checkpoint(path, checkpoint, {{}, {}, part_bytes_});
    lineage_.sequence = checkpoint.lineage.sequence;
    last_written_ = path;
    last_written_step_ = checkpoint.position.global_step;
    prune_checkpoints(options_.dir, options_.keep, options_.resumed_from);
    return;
  }
  wait();
  // Taken now, in write order: a write that fails leaves a gap in the sequence, which only orders.
  lineage_.sequence = checkpoint.lineage.sequence;
  const int64_t step = checkpoint.position.global_step;
  start_write(path, step, /*whole=*/true,
              [this, path, staged = std::move(pending.staged), checkpoint = std::move(checkpoint),
               delay = test_delay(), part_bytes = part_bytes_]() mutable {
                const metrics::Stopwatch pruning;
                // Its failure is this write's, but only once the files are written: they hold a state that trained.
                std::exception_ptr pruning_error;
                try {
                  join_pruner();
                } catch (...) {
                  pruning_error = std::current_exception();
                }
                done_.phases.pruning = pruner_seconds_;
                done_.phases.pruning_waited = pruning.elapsed_seconds();
                const metrics::Stopwatch clock;
                put_sections(checkpoint, staged->begin_host_copies());
                done_.phases.copies_queued = clock.elapsed_seconds();
                std::atomic<double> waited{0};
                save_checkpoint(path, checkpoint, {delay, arrived_bytes(*staged, waited), part_bytes});
                done_.phases.files = clock.elapsed_seconds();
                done_.phases.copies_waited = waited;
                if (pruning_error) std::rethrow_exception(pruning_error);
                prune_in_background();
              });
}

void Checkpointer::write(const std::string& path, Checkpoint checkpoint) { write(take(path, std::move(checkpoint))); }

void Checkpointer::reserve_host_memory(const std::vector<io::NamedTensors>& sections) {
  host_area_->reserve(sections);
}

std::shared_ptr<StagedSections> Checkpointer::stage(std::vector<io::NamedTensors> sections) {
  std::shared_ptr<StagedSections> staged = stage_sections(std::move(sections), host_area_);
  if (staging_ != staged->place() && options_.owner) {
    if (staged->place() == StagingPlace::device)
      std::cout << "--async-checkpoint: checkpoints are staged on the device (a snapshot of "
                << staged->device_bytes() / (1 << 20)
                << " MiB, kept in the allocator's cache between saves) and copied to host memory beside the steps"
                << std::endl;
    else if (staging_)
      std::cout << "--async-checkpoint: the device has no room for a snapshot now; this checkpoint is staged in "
                   "host memory while the step waits"
                << std::endl;
  }
  staging_ = staged->place();
  return staged;
}

void Checkpointer::write_shard(const std::string& path, int64_t rank, int64_t ranks, const io::NamedTensors& shards,
                               const nlohmann::json& layout) {
  write(take_shard(path, rank, ranks, shards, layout));
}

void Checkpointer::write_shard_file(PendingWrite pending) {
  const std::string& path = pending.path;
  auto& shard = *pending.shard;
  if (!options_.async) {
    save_shard(path, shard.rank, shard.ranks, copy_to_pinned_host({shard.tensors}, *host_area_).at(0), shard.layout);
    return;
  }
  wait();
  start_write(shard_path(path, shard.rank), -1, /*whole=*/false,
              [this, path, rank = shard.rank, ranks = shard.ranks, staged = std::move(pending.staged),
               layout = std::move(shard.layout), delay = test_delay()] {
                const metrics::Stopwatch clock;
                std::atomic<double> waited{0};
                auto arriving = staged->begin_host_copies();
                done_.phases.copies_queued = clock.elapsed_seconds();
                save_shard(path, rank, ranks, arriving.at(0), layout, delay, arrived_bytes(*staged, waited));
                done_.phases.files = clock.elapsed_seconds();
                done_.phases.copies_waited = waited;
              });
}

std::function<void()> Checkpointer::test_delay() const {
  if (test_delay_ms_ <= 0) return {};
  return [ms = test_delay_ms_] { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); };
}

void Checkpointer::start_write(const std::string& path, int64_t step, bool whole, std::function<void()> job) {
  done_ = Done{path, step, whole, 0, {}, nullptr};
  worker_ = std::thread([this, job = std::move(job)] {
    const auto start = std::chrono::steady_clock::now();
    try {
      job();
    } catch (...) {
      done_.error = std::current_exception();
    }
    done_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  });
}

double Checkpointer::write_seconds() const {
  return std::accumulate(writes_seconds_.begin(), writes_seconds_.end(), 0.0);
}

void Checkpointer::wait() {
  if (!worker_.joinable()) return;
  worker_.join();
  writes_seconds_.push_back(done_.seconds);
  writes_phases_.push_back(done_.phases);
  if (done_.error) {
    const std::exception_ptr error = std::exchange(done_.error, nullptr);
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      throw Error("--async-checkpoint: the background write of " + done_.path + " failed: " + e.what());
    }
  }
  if (done_.whole) {
    last_written_ = done_.path;
    last_written_step_ = done_.step;
  }
}

void Checkpointer::wait_all() {
  wait();
  join_pruner();
}

void Checkpointer::prune_in_background() {
  pruner_ = std::thread([this] {
    const metrics::Stopwatch clock;
    try {
      prune_checkpoints(options_.dir, options_.keep, options_.resumed_from);
    } catch (...) {
      pruner_error_ = std::current_exception();
    }
    pruner_seconds_ = clock.elapsed_seconds();
  });
}

void Checkpointer::join_pruner() {
  if (!pruner_.joinable()) return;
  pruner_.join();
  if (!pruner_error_) return;
  const std::exception_ptr error = std::exchange(pruner_error_, nullptr);
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    throw Error("--keep-checkpoints: removing old checkpoints in " + options_.dir + " failed: " + e.what());
  }
}

io::NamedTensors staged_on_host(const io::NamedTensors& tensors) {
  return stage_sections({tensors})->finish().at(0);
}

}  // namespace ptrain::train
