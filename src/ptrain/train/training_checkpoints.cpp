// What a run keeps across processes: resuming from a checkpoint, saving one (whole or in shards), and
// --save-weights; a state that is not finite is never written. A run that a signal stops, or that fails
// once it has trained, ends here too, saying what it kept.
#include <algorithm>
#include <csignal>
#include <filesystem>
#include <iostream>
#include <map>
#include <numeric>
#include <set>

#include <c10/util/Exception.h>

#include "ptrain/core/error.h"
#include "ptrain/models/state_dict.h"
#include "ptrain/train/training_run.h"

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

}  // namespace

std::string TrainingRun::run_length_source() const {
  if (c_.run.max_steps > 0) return "--max-steps " + std::to_string(c_.run.max_steps);
  std::string source = "--epochs " + std::to_string(c_.run.epochs) + " of " + std::to_string(steps_per_epoch_) + " steps";
  if (c_.data.train_limit > 0) source += " at --train-limit " + std::to_string(c_.data.train_limit);
  return source;
}

void TrainingRun::resume() {
  if (!plan_.restart_note.empty() && strategy_->is_main()) std::cout << "ptrain: " << plan_.restart_note << std::endl;
  if (!plan_.resume_note.empty() && strategy_->is_main()) std::cout << plan_.resume_note << std::endl;
  if (!plan_.resume_path.empty()) resume_from(load_checkpoint(plan_.resume_path));
  stop_rules_.check_pause_point(global_step_, total_steps_, run_length_source(), plan_.resume_path);
}

void TrainingRun::reserve_checkpoint_staging() {
  if (!checkpointer_ || !checkpointer_->async()) return;
  // The state a save stages: the whole checkpoint's on the rank that writes it, each rank's shards when
  // sharded (a block too small for a later save is pinned again by that save's write).
  const bool sharded = plan_.strategy_options.state_dict == strategies::StateDict::sharded;
  if (sharded || strategy_->is_main()) checkpointer_->reserve_host_memory({models::state_dict(*model_), optimizer_->state()});
}

void TrainingRun::resume_from(Checkpoint ckpt) {
  load_model_state(ckpt.model);
  optimizer_->load_state(target_->local_optimizer_state(ckpt.optimizer), plan_.resume_path);
  if (scaler_) scaler_->load_state(ckpt.scaler);
  // The saved totals are summed over the ranks of the run that saved them: one rank carries them on.
  if (strategy_->rank() == 0) totals_->load(ckpt.progress);
  start_ = ckpt.position;
  global_step_ = ckpt.position.global_step;
  const int64_t world = devices();
  if (ckpt.position.world_size != world || ckpt.position.batch_size != c_.run.batch_size) {
    // Another world size or per-device batch: continue from the same number of samples into the epoch, at
    // a step boundary of the new layout, with the schedule's step counted in the new layout too. The order of
    // the epoch's remaining samples differs, as it must once the ranks split the data differently.
    const int64_t samples = ckpt.position.micro_batch * ckpt.position.batch_size * ckpt.position.world_size;
    const int64_t step_in_epoch = samples / (c_.run.batch_size * c_.optim.grad_accum * world);
    start_.micro_batch = step_in_epoch * c_.optim.grad_accum;
    global_step_ = ckpt.position.epoch * steps_per_epoch_ + step_in_epoch;
    if (strategy_->is_main())
      std::cout << "resuming a checkpoint of " << ckpt.position.world_size << " device(s) x batch "
                << ckpt.position.batch_size << " with " << world << " x " << c_.run.batch_size << ": epoch "
                << ckpt.position.epoch + 1 << " continues after about " << samples << " samples, at step "
                << global_step_ << std::endl;
  }
  const std::string changed = changed_schedule_settings(ckpt.run, config::to_json(c_));
  const int64_t accum = c_.optim.grad_accum;
  // A restarted job whose training had ended (a rank failed in the final evaluation, or as the ranks exited)
  // resumes at the run's end: its evaluation and outputs are what is left (train_epochs).
  const bool restarted_at_end = plan_.restart.count > 0 && global_step_ == total_steps_;
  check(global_step_ < total_steps_ || restarted_at_end,
        plan_.resume_path + ": the checkpoint is at step " + std::to_string(global_step_) + " and this run ends at step " +
            std::to_string(total_steps_) + " (" + run_length_source() + "): nothing is left to train" +
            (changed.empty() ? "" : " (" + changed + ")"));
  check(start_.micro_batch <= micro_batches_per_epoch_,
        plan_.resume_path + ": the checkpoint is " + std::to_string((start_.micro_batch + accum - 1) / accum) +
            " steps into epoch " +
            std::to_string(start_.epoch + 1) + ", which has " + std::to_string(steps_per_epoch_) + " steps in this run" +
            (changed.empty() ? "" : " (" + changed + ")") + ": its data and batches differ from the checkpoint's run");
  // A changed length moves a cosine or step schedule's rates: the run goes on, but not as the saved one would have.
  if (!changed.empty() && strategy_->is_main())
    std::cerr << "ptrain: warning: resuming " << plan_.resume_path << " with " << changed
              << ": the learning rates from step " << global_step_ << " on follow this run's schedule, not the saved run's"
              << std::endl;
}

// The checkpoint holds every parameter whole (the fp32 masters where there are any) and the buffers:
// parameters go through the update target, which owns their shards and masters; buffers are copied here.
void TrainingRun::load_model_state(const io::NamedTensors& saved) {
  target_->load_full_parameters(saved, plan_.resume_path);
  std::map<std::string, torch::Tensor> by_name(saved.begin(), saved.end());
  torch::NoGradGuard no_grad;
  for (const auto& item : model_->named_buffers()) {
    auto it = by_name.find(item.key());
    check(it != by_name.end(), plan_.resume_path + ": buffer '" + item.key() + "' is missing");
    check(it->second.sizes() == item.value().sizes(), plan_.resume_path + ": buffer '" + item.key() + "' has shape " +
                                                          c10::str(it->second.sizes()) + ", expected " +
                                                          c10::str(item.value().sizes()));
    item.value().copy_(it->second);
  }
}

void TrainingRun::open_checkpoint_dir() {
  if (c_.run.checkpoint_dir.empty()) return;
  // Rank 0 cleans up before anything writes there: every other rank waits for it at its first collective.
  checkpointer_ = std::make_unique<Checkpointer>(CheckpointerOptions{c_.run.checkpoint_dir, c_.run.keep_checkpoints,
                                                                     plan_.resume_path, c_.run.overwrite_checkpoints,
                                                                     strategy_->is_main(), c_.run.async_checkpoint});
}

namespace {

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

double TrainingRun::CheckpointBlocking::total() const {
  return std::accumulate(saves.begin(), saves.end(), end_wait);
}

void TrainingRun::save(TrainingPosition position) {
  if (!checkpointer_) return;
  const BlockedTime blocked(checkpoint_blocking_.saves.emplace_back(0.0));
  {
    const BlockedTime waiting(checkpoint_blocking_.waits.emplace_back(0.0));
    settle_checkpoint_writes();
  }
  write_checkpoint(position);
}

void TrainingRun::finish_checkpoint_writes() {
  if (!checkpointer_ || !checkpointer_->async()) return;
  const BlockedTime blocked(checkpoint_blocking_.end_wait);
  settle_checkpoint_writes();
  checkpointer_->wait();
}

void TrainingRun::settle_checkpoint_writes() {
  if (!checkpointer_->async()) return;
  std::string failure;
  try {
    checkpointer_->wait();
  } catch (const Error& e) {
    failure = e.what();
  }
  if (strategy_->world_size() > 1) {
    // Here, in the training thread at a step boundary: collectives must never run from the writer thread.
    auto failed = torch::full({1}, failure.empty() ? 0.0f : 1.0f, torch::TensorOptions().device(device_));
    strategy_->all_reduce_sum(failed);
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

void TrainingRun::write_checkpoint(TrainingPosition position) {
  // The checks read their verdict on the host, so they wait for the device to finish every step queued. A
  // synchronous save checks first and takes nothing it will not write. An asynchronous one takes (stages) the
  // state first: its copies are queued behind those steps and run during the checks' wait, where after the
  // checks they would run with the device otherwise idle. A state that fails the checks is dropped unwritten.
  const bool check_first = !checkpointer_->async();
  if (check_first && !fit_to_save(position.global_step)) return;
  const RunningTotals progress_totals = reduced_totals();
  const std::string path = checkpointer_->path_for(position.global_step);
  strategy_->sync_buffers();  // the statistics every rank evaluates with are the ones saved
  Checkpoint ckpt;
  ckpt.model = models::state_dict(*model_);
  const bool sharded = plan_.strategy_options.state_dict == strategies::StateDict::sharded;
  std::optional<PendingWrite> shard_write;
  nlohmann::json layout;
  if (sharded) {
    // Every rank writes its shards; once all have, rank 0 writes the checkpoint that names them.
    const auto shards = target_->local_shards(optimizer_->state(), &layout);
    shard_write = checkpointer_->take_shard(path, strategy_->rank(), strategy_->world_size(), shards, layout);
  } else {
    // Gathering shards is collective: every rank takes part, rank 0 writes.
    const auto params = target_->full_parameters();
    ckpt.optimizer = target_->full_optimizer_state(optimizer_->state());
    std::map<std::string, torch::Tensor> full(params.begin(), params.end());
    for (auto& [name, tensor] : ckpt.model) {
      auto it = full.find(name);
      if (it != full.end()) tensor = it->second;
    }
  }
  position.world_size = devices();
  position.batch_size = c_.run.batch_size;
  ckpt.position = position;
  if (scaler_) ckpt.scaler = scaler_->state();
  ckpt.progress = progress_totals.named();
  ckpt.run = config::to_json(c_);
  std::optional<PendingWrite> whole_write;
  if (!sharded && strategy_->is_main()) whole_write = checkpointer_->take(path, std::move(ckpt));
  if (!check_first && !fit_to_save(position.global_step)) return;
  if (!sharded) {
    if (whole_write) checkpointer_->write(std::move(*whole_write));
    return;
  }
  checkpointer_->write(std::move(*shard_write));
  // The sum's value read on the host is the barrier: it exists only once every rank has contributed (an
  // NCCL wait alone only orders the stream). Async: the shards are still being written; the ranks agree
  // that they are at the next settle.
  if (!checkpointer_->async()) strategy_->all_reduce_sum(torch::ones({1}, device_)).item<float>();
  if (!strategy_->is_main()) return;
  std::set<std::string> in_shards;
  for (const auto& group : layout)
    for (const auto& p : group.at("params")) in_shards.insert(p.at("name").get<std::string>());
  io::NamedTensors rest;
  for (auto& [name, tensor] : ckpt.model)
    if (!in_shards.count(name)) rest.emplace_back(name, tensor);
  ckpt.model = std::move(rest);
  ckpt.shards = strategy_->world_size();
  if (checkpointer_->async()) {
    // Staged now: the buffers it holds change with the next step, long before it is written.
    for (auto* section : {&ckpt.model, &ckpt.optimizer, &ckpt.scaler, &ckpt.progress}) *section = staged_on_host(*section);
    pending_checkpoint_.emplace(path, std::move(ckpt));
    return;
  }
  checkpointer_->write(path, std::move(ckpt));
}

bool TrainingRun::fit_to_save(int64_t global_step) {
  check_divergence();
  if (state_is_finite()) return true;
  stop_rules_.state_not_finite("training diverged at step " + std::to_string(global_step) +
                                   ": the weights are not finite; no checkpoint saved",
                               global_step);
  return false;
}

bool TrainingRun::state_is_finite() {
  torch::NoGradGuard no_grad;
  auto bad = torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device_));
  const auto count = [&](const torch::Tensor& t) {
    if (t.defined() && t.is_floating_point() && t.numel() > 0)
      bad.add_(torch::logical_not(torch::isfinite(t)).sum().to(bad.device()));
  };
  for (const auto& p : optimizer_->params()) count(p);
  for (const auto& b : model_->buffers()) count(b);
  strategy_->all_reduce_sum(bad);
  return bad.item<double>() == 0;
}

// --save-weights: the model's state_dict with every parameter whole (gathering shards is collective;
// rank 0 writes), fp32 masters where there are any.
void TrainingRun::export_weights() {
  if (c_.model.save_weights.empty()) return;
  // As for checkpoints: NaN weights written under the name of the trained ones would be taken for them.
  if (!state_is_finite()) {
    const std::string what = "--save-weights " + c_.model.save_weights + " not written: the weights after step " +
                             std::to_string(global_step_) + " are not finite (training diverged)";
    stop_rules_.state_not_finite(what, global_step_);
    weights_refused_ = true;
    return;
  }
  strategy_->sync_buffers();
  const auto params = target_->full_parameters();
  if (!strategy_->is_main()) return;
  std::map<std::string, torch::Tensor> full(params.begin(), params.end());
  auto tensors = models::state_dict(*model_);
  for (auto& [name, tensor] : tensors) {
    auto it = full.find(name);
    tensor = (it != full.end() ? it->second : tensor).to(torch::kCPU);
  }
  const auto parent = std::filesystem::path(c_.model.save_weights).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  models::write_weights(c_.model.save_weights, tensors);
  weights_exported_ = true;
}

namespace {

std::string signal_name(int signal_number) {
  if (signal_number == SIGTERM) return "SIGTERM";
  if (signal_number == SIGINT) return "SIGINT";
  return "signal " + std::to_string(signal_number);
}

}  // namespace

std::string TrainingRun::what_was_kept() const {
  std::string kept;
  if (weights_exported_) kept = "weights in " + c_.model.save_weights;
  if (checkpointer_ && !checkpointer_->last_written().empty()) {
    kept += (kept.empty() ? "" : " and ") + std::string("checkpoint ") + checkpointer_->last_written() + " (step " +
            std::to_string(checkpointer_->last_written_step()) + ")";
  }
  return kept;
}

nlohmann::json TrainingRun::run_end(const std::string& status, const std::string& error) const {
  nlohmann::json end = {{"status", status}, {"steps", global_step_}, {"checkpoint", nullptr}, {"weights", nullptr}};
  if (checkpointer_ && !checkpointer_->last_written().empty()) end["checkpoint"] = checkpointer_->last_written();
  if (weights_exported_) end["weights"] = c_.model.save_weights;
  if (weights_refused_) end["weights_refused"] = "the weights were not finite";
  if (scalar_log_ && !scalar_log_->failed().empty()) end["logs_given_up"] = scalar_log_->failed();
  if (!error.empty()) end["error"] = error;
  if (stop_rules_.signal()) end["signal"] = signal_name(stop_rules_.signal());
  if (plan_.restart.count > 0) {
    end["restarts"] = plan_.restart.count;
    end["restart_causes"] = plan_.restart.causes;
  }
  return end;
}

void TrainingRun::stop_at_signal(const TrainingPosition& position) {
  // Every rank agreed to stop at this step (StopRules::stop_after): the save's collectives meet. The run ends
  // only once the write in flight is on disk: the message below and the record name it.
  save(position);
  finish_checkpoint_writes();
  if (sampler_) sampler_->stop();
  profiler_.finish(global_step_);
  fill_record(run_clock_, std::nullopt);
  record_.extra["run_end"] = run_end("interrupted", "");
  std::string what = "stopped by " + signal_name(stop_rules_.signal()) + " after step " + std::to_string(global_step_) + " of " +
                     std::to_string(total_steps_);
  if (checkpointer_ && checkpointer_->last_written_step() == global_step_) {
    what += ": its checkpoint is " + checkpointer_->last_written() + "; continue with the same command and --resume latest";
  } else if (checkpointer_) {
    what += ": no checkpoint of it was written" + (checkpointer_->last_written().empty()
                                                        ? std::string()
                                                        : " (the newest is " + checkpointer_->last_written() + ")");
  } else {
    what += ": nothing saved (without --checkpoint-dir there is no checkpoint to resume from)";
  }
  throw RunStopped(what, record_, 128 + stop_rules_.signal());
}

void TrainingRun::fail_keeping_trained_state(const std::exception& error) {
  int exit_code = 2;
  std::string message = error.what();
  if (const auto* torch_error = dynamic_cast<const c10::Error*>(&error)) {
    // LibTorch's messages carry a source location and a stack on the lines after the first.
    message = torch_error->what_without_backtrace();
    message = "LibTorch error: " + message.substr(0, message.find('\n'));
    exit_code = 3;
  }
  if (checkpointer_) {
    try {
      checkpointer_->wait();  // what it holds counts as kept only once written
    } catch (const std::exception& write_error) {
      message += "; " + std::string(write_error.what());
    }
  }
  const std::string kept = what_was_kept();
  const std::string after = evaluating_ ? "evaluation failed after training step " : "the run failed after step ";
  try {
    if (sampler_) sampler_->stop();
    fill_record(run_clock_, std::nullopt);
  } catch (const std::exception&) {
    // The record is what can be filled in; the error below is what matters.
  }
  record_.extra["run_end"] = run_end("failed", message);
  throw RunStopped(after + std::to_string(global_step_) + " (" + message + "); " +
                       (kept.empty() ? "nothing was saved: " + why_nothing_was_kept() : "the trained state is kept: " + kept),
                   record_, exit_code);
}

std::string TrainingRun::why_nothing_was_kept() const {
  if (c_.run.checkpoint_dir.empty() && c_.model.save_weights.empty()) return "no --checkpoint-dir or --save-weights";
  std::string why = c_.run.checkpoint_dir.empty() ? "no --checkpoint-dir" : "no checkpoint was written";
  if (c_.model.save_weights.empty()) return why + " and no --save-weights";
  return why + ", and --save-weights " + c_.model.save_weights +
         (weights_refused_ ? " was not written: the weights were not finite"
                           : " is written only once the last epoch's steps are done");
}

void TrainingRun::stop_diverged(const std::exception& error) {
  try {
    if (sampler_) sampler_->stop();
    profiler_.finish(global_step_);
    fill_record(run_clock_, std::nullopt);
  } catch (const std::exception&) {
    // The record is what can be filled in; the divergence below is what matters.
  }
  record_.extra["run_end"] = run_end("diverged", error.what());
  throw RunStopped(error.what(), record_, 2);
}

}  // namespace ptrain::train
