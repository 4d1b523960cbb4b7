// The run's side of what it keeps across processes (run/run_checkpoints.h writes and resumes the files): the
// named states a checkpoint holds, as the step engine (run/step_engine.h) gives them and takes them back, and
// the divergence check before a save. A run that a signal stops, or that fails once it has trained, ends here
// too, saying what it kept.
#include <csignal>
#include <iostream>

#include <c10/util/Exception.h>

#include "ptrain/core/error.h"
#include "ptrain/train/training_run.h"

namespace ptrain::train {

std::string TrainingRun::run_length_source() const {
  if (plan_.length.max_steps > 0) return "--max-steps " + std::to_string(plan_.length.max_steps);
  std::string source =
      "--epochs " + std::to_string(plan_.length.epochs) + " of " + std::to_string(data_->steps_per_epoch()) + " steps";
  if (plan_.data_options.train_limit > 0) source += " at --train-limit " + std::to_string(plan_.data_options.train_limit);
  return source;
}

void TrainingRun::resume() {
  if (!plan_.restart_note.empty() && strategy_->is_main()) std::cout << "ptrain: " << plan_.restart_note << std::endl;
  if (!plan_.resume_note.empty() && strategy_->is_main()) std::cout << plan_.resume_note << std::endl;
  if (!plan_.resume_path.empty()) {
    position_.start = checkpoints_.resume({plan_.length.grad_accum, data_->steps_per_epoch(),
                                           data_->total_steps(), data_->micro_batches_per_epoch(),
                                           plan_.restart.count > 0, run_length_source()});
    position_.global_step = position_.start.global_step;
  }
  stop_rules_.check_pause_point(position_.global_step, data_->total_steps(), run_length_source(), plan_.resume_path);
}

io::NamedTensors TrainingRun::model_state() { return engine_->model_state(); }

io::NamedTensors TrainingRun::full_parameters() { return engine_->full_parameters(); }

io::NamedTensors TrainingRun::full_optimizer_state() { return engine_->full_optimizer_state(); }

io::NamedTensors TrainingRun::optimizer_state() { return engine_->optimizer_state(); }

io::NamedTensors TrainingRun::local_shards(nlohmann::json* layout) { return engine_->local_shards(layout); }

io::NamedTensors TrainingRun::scaler_state() { return engine_->scaler_state(); }

io::NamedTensors TrainingRun::progress_totals() { return engine_->progress_totals(); }

void TrainingRun::sync_buffers() { strategy_->sync_buffers(); }

bool TrainingRun::finite() { return engine_->finite(); }

void TrainingRun::load(const Checkpoint& checkpoint, const std::string& source) { engine_->load(checkpoint, source); }

namespace {

std::string signal_name(int signal_number) {
  if (signal_number == SIGTERM) return "SIGTERM";
  if (signal_number == SIGINT) return "SIGINT";
  return "signal " + std::to_string(signal_number);
}

}  // namespace

nlohmann::json TrainingRun::run_end(const std::string& status, const std::string& error) const {
  nlohmann::json end = {
      {"status", status}, {"steps", position_.global_step}, {"checkpoint", nullptr}, {"weights", nullptr}};
  checkpoints_.describe_end(end);
  if (const auto given_up = monitor_.logs_given_up(); !given_up.empty()) end["logs_given_up"] = given_up;
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
  checkpoints_.save(position);
  checkpoints_.finish_writes();
  monitor_.stop_gpu_sampler();
  monitor_.finish_trace(position_.global_step);
  fill_record(std::nullopt);
  recorder_.note_run_end(run_end("interrupted", ""));
  std::string what = "stopped by " + signal_name(stop_rules_.signal()) + " after step " +
                     std::to_string(position_.global_step) + " of " +
                     std::to_string(data_->total_steps());
  if (checkpoints_.enabled() && checkpoints_.last_written_step() == position_.global_step) {
    what += ": its checkpoint is " + checkpoints_.last_written() + "; continue with the same command and --resume latest";
  } else if (checkpoints_.enabled()) {
    what += ": no checkpoint of it was written" + (checkpoints_.last_written().empty()
                                                        ? std::string()
                                                        : " (the newest is " + checkpoints_.last_written() + ")");
  } else {
    what += ": nothing saved (without --checkpoint-dir there is no checkpoint to resume from)";
  }
  throw RunStopped(what, recorder_.record(), 128 + stop_rules_.signal());
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
  // What the write in flight holds counts as kept only once written.
  if (const std::string write_error = checkpoints_.wait_quietly(); !write_error.empty()) message += "; " + write_error;
  const std::string kept = checkpoints_.what_was_kept();
  const std::string after =
      position_.evaluating ? "evaluation failed after training step " : "the run failed after step ";
  try {
    monitor_.stop_gpu_sampler();
    fill_record(std::nullopt);
  } catch (const std::exception&) {
    // The record is what can be filled in; the error below is what matters.
  }
  recorder_.note_run_end(run_end("failed", message));
  throw RunStopped(after + std::to_string(position_.global_step) + " (" + message + "); " +
                       (kept.empty() ? "nothing was saved: " + checkpoints_.why_nothing_was_kept() : "the trained state is kept: " + kept),
                   recorder_.record(), exit_code);
}

void TrainingRun::stop_diverged(const std::exception& error) {
  try {
    monitor_.stop_gpu_sampler();
    monitor_.finish_trace(position_.global_step);
    fill_record(std::nullopt);
  } catch (const std::exception&) {
    // The record is what can be filled in; the divergence below is what matters.
  }
  recorder_.note_run_end(run_end("diverged", error.what()));
  throw RunStopped(error.what(), recorder_.record(), 2);
}

}  // namespace ptrain::train
