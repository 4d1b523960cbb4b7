// When a run ends before its last step, decided in one place: a stop signal every rank agreed on, the pause
// of --stop-at-step, and what a divergence does under --on-divergence. The loop asks once a step; the
// divergence watch's readings and the checkpoints and weights about to be written report here what they found.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include <torch/torch.h>

namespace ptrain::train {

// --on-divergence: a diverged run ends (its record marked "diverged", nothing diverged saved), or trains on
// with a warning.
enum class OnDivergence { kStop, kWarn };

class StopRules {
 public:
  struct Options {
    OnDivergence on_divergence = OnDivergence::kStop;
    int64_t stop_at_step = 0;  // --stop-at-step; 0: the run never pauses
    // A signal number to stop at this step boundary, 0 to train on (TrainHooks::stop_signal); empty: never.
    std::function<int()> stop_signal;
    bool warns = false;  // whether this rank prints the warnings (the main one)
  };
  // sum_over_ranks all-reduces a tensor in place over the run's world_size ranks (every rank calls it together).
  StopRules(Options options, const torch::Device& device, int64_t world_size,
            std::function<void(torch::Tensor&)> sum_over_ranks);

  // Before the first step: --stop-at-step must come after the step the run starts from and before its end.
  // run_length: which flags set the end ("--max-steps 40"); resumed_from: the checkpoint resumed, if any.
  void check_pause_point(int64_t first_step, int64_t total_steps, const std::string& run_length,
                         const std::string& resumed_from) const;

  // After optimizer step `step` of total_steps: whether the run stops there, for an agreed signal (signal())
  // or a pause (paused()). Collective with several ranks at progress reads (at_progress_read), where the host
  // waits for the device anyway: a signal is agreed on there, so it comes at most --log-every steps late.
  bool stop_after(int64_t step, int64_t total_steps, bool at_progress_read);
  int signal() const { return signal_; }  // the signal every rank stops for, 0 for none
  bool paused() const { return paused_; }

  // The divergence watch read diverged steps, the first at first_step (what: its description). Under
  // --on-divergence stop this throws; under warn it warns the first time and the run trains on.
  void diverged(const std::string& what, int64_t first_step);
  // A state about to be written (a checkpoint, --save-weights) is not finite at `step`. Under stop this throws;
  // under warn it warns, and the caller writes nothing.
  void state_not_finite(const std::string& what, int64_t step);
  // The first diverged step, once a divergence was found.
  std::optional<int64_t> diverged_at_step() const { return diverged_at_step_; }
  // Whether the error in flight is the stop of a diverged run (the record is still written, marked "diverged").
  bool stopping_on_divergence() const { return stopping_on_divergence_; }

 private:
  int agreed_signal(bool at_progress_read) const;
  [[noreturn]] void stop_diverged(const std::string& what);

  Options options_;
  torch::Device device_;
  int64_t world_size_;
  std::function<void(torch::Tensor&)> sum_over_ranks_;
  int signal_ = 0;
  bool paused_ = false;
  std::optional<int64_t> diverged_at_step_;
  bool stopping_on_divergence_ = false;
};

}  // namespace ptrain::train
