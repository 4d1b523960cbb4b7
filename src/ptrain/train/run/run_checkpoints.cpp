#include "ptrain/train/run/run_checkpoints.h"

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>
#include <numeric>
#include <set>

#include "ptrain/core/error.h"
#include "ptrain/metrics/timer.h"
#include "ptrain/models/state_dict.h"

namespace ptrain::train {

namespace {

// The settings that fix the learning rate of every step: the run's length (epochs, --max-steps, the data and
// batch that make its steps) and the schedule's own, as the checkpoint's `run` config names them.
constexpr std::pair<const char*, const char*> kScheduleSettings[] = {
    {"run", "epochs"},           {"run", "max_steps"},         {"run", "batch_size"},
    {"data", "train_limit"},     {"optimizer", "grad_accum"},  {"optimizer", "schedule"},
    {"optimizer", "lr"},         {"optimizer", "min_lr"},      {"optimizer", "warmup_epochs"},
    {"optimizer", "warmup_steps"}, {"optimizer", "milestones"}, {"optimizer", "gamma"},
    {"optimizer", "warmup_type"}, {"optimizer", "warmup_min_lr"}};

std::string setting_text(const nlohmann::json& value) {
  return value.is_string() ? value.get<std::string>() : value.dump();
}

// "--max-steps 5 -> 0, --epochs 1 -> 2": the schedule's settings that differ between the checkpoint's run
// and this one; empty for a checkpoint that holds no config.
std::string changed_schedule_settings(const nlohmann::json& saved, const nlohmann::json& now) {
  std::string changed;
  for (const auto& [section, key] : kScheduleSettings) {
    if (!saved.is_object() || !saved.contains(section) || !saved[section].contains(key)) continue;
    const auto& before = saved[section][key];
    const auto& after = now[section][key];
    if (before == after) continue;
    std::string flag = key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    changed += (changed.empty() ? "--" : ", --") + flag + " " + setting_text(before) + " -> " + setting_text(after);
  }
  return changed;
}

// Adds the time it lives to `total`, however its scope ends (a failed save held the step up too).
class BlockedTime {
 public:
  explicit BlockedTime(double& total) : total_(total) {}
  BlockedTime(const BlockedTime&) = delete;
  BlockedTime& operator=(const BlockedTime&) = delete;
  ~BlockedTime() { total_ += clock_.elapsed_seconds(); }

 private:
  double& total_;
  const metrics::Stopwatch clock_;
};

}  // namespace

RunCheckpoints::RunCheckpoints(Options options, CheckpointedState& state, StopRules& stop_rules)
    : options_(std::move(options)), state_(state), stop_rules_(stop_rules) {}

void RunCheckpoints::open() {
  if (options_.dir.empty()) return;
  // Rank 0 cleans up before anything writes there: every other rank waits for it at its first collective.
  checkpointer_ = std::make_unique<Checkpointer>(CheckpointerOptions{options_.dir, options_.keep, options_.resume_path,
                                                                     options_.overwrite, options_.is_main,
                                                                     options_.async});
}

TrainingPosition RunCheckpoints::resume(const RunShape& shape) {
  const std::string& path = options_.resume_path;
  Checkpoint ckpt = load_checkpoint(path);
  state_.load(ckpt, path);
  TrainingPosition start = ckpt.position;
  const int64_t world = options_.devices, batch_size = options_.batch_size, accum = shape.grad_accum;
  if (ckpt.position.world_size != world || ckpt.position.batch_size != batch_size) {
    // Another world size or per-device batch: continue from the same number of samples into the epoch, at
    // a step boundary of the new layout, with the schedule's step counted in the new layout too. The order of
    // the epoch's remaining samples differs, as it must once the ranks split the data differently.
    const int64_t samples = ckpt.position.micro_batch * ckpt.position.batch_size * ckpt.position.world_size;
    const int64_t step_in_epoch = samples / (batch_size * accum * world);
    start.micro_batch = step_in_epoch * accum;
    start.global_step = ckpt.position.epoch * shape.steps_per_epoch + step_in_epoch;
    if (options_.is_main)
      std::cout << "resuming a checkpoint of " << ckpt.position.world_size << " device(s) x batch "
                << ckpt.position.batch_size << " with " << world << " x " << batch_size << ": epoch "
                << ckpt.position.epoch + 1 << " continues after about " << samples << " samples, at step "
                << start.global_step << std::endl;
  }
  const int64_t step = start.global_step;
  const std::string changed = changed_schedule_settings(ckpt.run, options_.run_config);
  // A restarted job whose training had ended (a rank failed in the final evaluation, or as the ranks exited)
  // resumes at the run's end: its evaluation and outputs are what is left.
  const bool restarted_at_end = shape.restarted && step == shape.total_steps;
  check(step < shape.total_steps || restarted_at_end,
        path + ": the checkpoint is at step " + std::to_string(step) + " and this run ends at step " +
            std::to_string(shape.total_steps) + " (" + shape.run_length + "): nothing is left to train" +
            (changed.empty() ? "" : " (" + changed + ")"));
  check(start.micro_batch <= shape.micro_batches_per_epoch,
        path + ": the checkpoint is " + std::to_string((start.micro_batch + accum - 1) / accum) +
            " steps into epoch " + std::to_string(start.epoch + 1) + ", which has " +
            std::to_string(shape.steps_per_epoch) + " steps in this run" +
            (changed.empty() ? "" : " (" + changed + ")") + ": its data and batches differ from the checkpoint's run");
  // A changed length moves a cosine or step schedule's rates: the run goes on, but not as the saved one would have.
  if (!changed.empty() && options_.is_main)
    std::cerr << "ptrain: warning: resuming " << path << " with " << changed << ": the learning rates from step "
              << step << " on follow this run's schedule, not the saved run's" << std::endl;
  return start;
}

void RunCheckpoints::reserve_staging() {
  if (!checkpointer_) return;
  // The state a save stages: the whole checkpoint's on the rank that writes it, each rank's shards when
  // sharded (a block too small for a later save is pinned again by that save's write). Not the progress
  // totals: reading them is collective; the block's slack holds them.
  if (options_.sharded || options_.is_main)
    checkpointer_->reserve_host_memory({state_.model_state(), state_.optimizer_state(), state_.scaler_state()});
}

double RunCheckpoints::Blocking::total() const { return std::accumulate(saves.begin(), saves.end(), end_wait); }

void RunCheckpoints::save(TrainingPosition position) {
  if (!checkpointer_) return;
  const BlockedTime blocked(blocking_.saves.emplace_back(0.0));
  {
    const BlockedTime waiting(blocking_.waits.emplace_back(0.0));
    settle_writes();
  }
  write_checkpoint(position);
}

void RunCheckpoints::finish_writes() {
  if (!checkpointer_ || !checkpointer_->async()) return;
  const BlockedTime blocked(blocking_.end_wait);
  settle_writes();
  checkpointer_->wait_all();
}

std::string RunCheckpoints::wait_quietly() {
  if (!checkpointer_) return "";
  try {
    checkpointer_->wait_all();  // what it holds counts as kept only once written
  } catch (const std::exception& write_error) {
    return write_error.what();
  }
  return "";
}

void RunCheckpoints::settle_writes() {
  if (!checkpointer_->async()) return;
  std::string failure;
  try {
    checkpointer_->wait();
  } catch (const Error& e) {
    failure = e.what();
  }
  if (options_.world_size > 1) {
    // Here, in the training thread at a step boundary: collectives must never run from the writer thread.
    auto failed = torch::full({1}, failure.empty() ? 0.0f : 1.0f, torch::TensorOptions().device(options_.device));
    options_.sum_over_ranks(failed);
    if (failure.empty() && failed.item<float>() > 0)
      failure = "--async-checkpoint: the background write of another rank's checkpoint file failed (its error names it)";
  }
  if (!failure.empty()) {
    pending_checkpoint_.reset();
    throw Error(failure);
  }
  // Every rank's shard of the last sharded save is on disk: the file that names them may now appear.
  if (pending_checkpoint_) {
    auto [path, ckpt] = std::move(*pending_checkpoint_);
    pending_checkpoint_.reset();
    checkpointer_->write(path, std::move(ckpt));
  }
}

void RunCheckpoints::write_checkpoint(TrainingPosition position) {
  // The checks read their verdict on the host, so they wait for the device to finish every step queued. A
  // synchronous save checks first and takes nothing it will not write. An asynchronous one takes (stages) the
  // state first: its copies are queued behind those steps and run during the checks' wait, where after the
  // checks they would run with the device otherwise idle. A state that fails the checks is dropped unwritten.
  const bool check_first = !checkpointer_->async();
  if (check_first && !fit_to_save(position.global_step)) return;
  io::NamedTensors progress_totals = state_.progress_totals();
  const std::string path = checkpointer_->path_for(position.global_step);
  state_.sync_buffers();
  Checkpoint ckpt;
  ckpt.model = state_.model_state();
  const bool sharded = options_.sharded;
  std::optional<PendingWrite> shard_write;
  nlohmann::json layout;
  if (sharded) {
    // Every rank writes its shards; once all have, rank 0 writes the checkpoint that names them.
    const auto shards = state_.local_shards(&layout);
    shard_write = checkpointer_->take_shard(path, options_.rank, options_.world_size, shards, layout);
  } else {
    // Gathering shards is collective: every rank takes part, rank 0 writes.
    const auto params = state_.full_parameters();
    ckpt.optimizer = state_.full_optimizer_state();
    std::map<std::string, torch::Tensor> full(params.begin(), params.end());
    for (auto& [name, tensor] : ckpt.model) {
      auto it = full.find(name);
      if (it != full.end()) tensor = it->second;
    }
  }
  position.world_size = options_.devices;
  position.batch_size = options_.batch_size;
  ckpt.position = position;
  ckpt.scaler = state_.scaler_state();
  ckpt.progress = std::move(progress_totals);
  ckpt.run = options_.run_config;
  std::optional<PendingWrite> whole_write;
  if (!sharded && options_.is_main) whole_write = checkpointer_->take(path, std::move(ckpt));
  if (!check_first && !fit_to_save(position.global_step)) return;
  if (!sharded) {
    if (whole_write) checkpointer_->write(std::move(*whole_write));
    return;
  }
  checkpointer_->write(std::move(*shard_write));
  // The sum's value read on the host is the barrier: it exists only once every rank has contributed (an
  // NCCL wait alone only orders the stream). Async: the shards are still being written; the ranks agree
  // that they are at the next settle.
  if (!checkpointer_->async()) {
    auto barrier = torch::ones({1}, options_.device);
    options_.sum_over_ranks(barrier);
    barrier.item<float>();
  }
  if (!options_.is_main) return;
  std::set<std::string> in_shards;
  for (const auto& group : layout)
    for (const auto& p : group.at("params")) in_shards.insert(p.at("name").get<std::string>());
  io::NamedTensors rest;
  for (auto& [name, tensor] : ckpt.model)
    if (!in_shards.count(name)) rest.emplace_back(name, tensor);
  ckpt.model = std::move(rest);
  ckpt.shards = options_.world_size;
  if (checkpointer_->async()) {
    // Staged now: the buffers it holds change with the next step, long before it is written.
    for (auto* section : {&ckpt.model, &ckpt.optimizer, &ckpt.scaler, &ckpt.progress}) *section = staged_on_host(*section);
    pending_checkpoint_.emplace(path, std::move(ckpt));
    return;
  }
  checkpointer_->write(path, std::move(ckpt));
}

bool RunCheckpoints::fit_to_save(int64_t global_step) {
  state_.check_divergence();
  if (state_.finite()) return true;
  stop_rules_.state_not_finite("training diverged at step " + std::to_string(global_step) +
                                   ": the weights are not finite; no checkpoint saved",
                               global_step);
  return false;
}

// --save-weights: the model's state_dict with every parameter whole (gathering shards is collective;
// rank 0 writes), fp32 masters where there are any.
void RunCheckpoints::export_weights(int64_t step) {
  const std::string& file = options_.save_weights;
  if (file.empty()) return;
  // As for checkpoints: NaN weights written under the name of the trained ones would be taken for them.
  if (!state_.finite()) {
    const std::string what = "--save-weights " + file + " not written: the weights after step " +
                             std::to_string(step) + " are not finite (training diverged)";
    stop_rules_.state_not_finite(what, step);
    weights_refused_ = true;
    return;
  }
  state_.sync_buffers();
  const auto params = state_.full_parameters();
  if (!options_.is_main) return;
  std::map<std::string, torch::Tensor> full(params.begin(), params.end());
  auto tensors = state_.model_state();
  for (auto& [name, tensor] : tensors) {
    auto it = full.find(name);
    tensor = (it != full.end() ? it->second : tensor).to(torch::kCPU);
  }
  const auto parent = std::filesystem::path(file).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  models::write_weights(file, tensors);
  weights_exported_ = true;
}

std::string RunCheckpoints::last_written() const { return checkpointer_ ? checkpointer_->last_written() : ""; }

int64_t RunCheckpoints::last_written_step() const { return checkpointer_ ? checkpointer_->last_written_step() : 0; }

std::string RunCheckpoints::what_was_kept() const {
  std::string kept;
  if (weights_exported_) kept = "weights in " + options_.save_weights;
  if (!last_written().empty()) {
    kept += (kept.empty() ? "" : " and ") + std::string("checkpoint ") + last_written() + " (step " +
            std::to_string(last_written_step()) + ")";
  }
  return kept;
}

std::string RunCheckpoints::why_nothing_was_kept() const {
  const std::string& weights = options_.save_weights;
  if (options_.dir.empty() && weights.empty()) return "no --checkpoint-dir or --save-weights";
  std::string why = options_.dir.empty() ? "no --checkpoint-dir" : "no checkpoint was written";
  if (weights.empty()) return why + " and no --save-weights";
  return why + ", and --save-weights " + weights +
         (weights_refused_ ? " was not written: the weights were not finite"
                           : " is written only once the last epoch's steps are done");
}

void RunCheckpoints::describe_end(nlohmann::json& run_end) const {
  if (!last_written().empty()) run_end["checkpoint"] = last_written();
  if (weights_exported_) run_end["weights"] = options_.save_weights;
  if (weights_refused_) run_end["weights_refused"] = "the weights were not finite";
}

void RunCheckpoints::record(metrics::RunRecord& record) const {
  if (!checkpointer_) return;
  record.checkpoint_blocking_seconds = blocking_.total();
  record.extra["checkpoint_blocking"] = {
      {"saves", blocking_.saves}, {"waits", blocking_.waits}, {"end_wait", blocking_.end_wait}};
  if (checkpointer_->async()) {
    record.checkpoint_write_seconds = checkpointer_->write_seconds();
    record.extra["checkpoint_writes"] = checkpointer_->writes_seconds();
    nlohmann::json phases = nlohmann::json::array();
    for (const auto& p : checkpointer_->writes_phases())
      phases.push_back({{"files", p.files},
                        {"copies_queued", p.copies_queued},
                        {"copies_waited", p.copies_waited},
                        {"pruning", p.pruning},
                        {"pruning_waited", p.pruning_waited}});
    record.extra["checkpoint_write_phases"] = std::move(phases);
  }
  if (const auto staging = checkpointer_->staging()) record.extra["checkpoint_staging"] = to_string(*staging);
  nlohmann::json pinnings = nlohmann::json::array();
  for (const auto& p : checkpointer_->staging_pinnings())
    pinnings.push_back({{"bytes", p.bytes}, {"seconds", p.seconds}, {"reserved", p.reserved}});
  if (!pinnings.empty()) record.extra["checkpoint_pinned_blocks"] = std::move(pinnings);
}

}  // namespace ptrain::train
