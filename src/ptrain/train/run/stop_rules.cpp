#include "ptrain/train/run/stop_rules.h"

#include <iostream>
#include <utility>

#include "ptrain/core/error.h"

namespace ptrain::train {

namespace {

constexpr const char* kDivergenceAdvice = ". Try a lower --lr or --clip-grad-norm, or --on-divergence warn to train on";

}  // namespace

StopRules::StopRules(Options options, const torch::Device& device, int64_t world_size,
                     std::function<void(torch::Tensor&)> sum_over_ranks)
    : options_(std::move(options)), device_(device), world_size_(world_size),
      sum_over_ranks_(std::move(sum_over_ranks)) {}

void StopRules::check_pause_point(int64_t first_step, int64_t total_steps, const std::string& run_length,
                                  const std::string& resumed_from) const {
  const int64_t stop = options_.stop_at_step;
  if (stop == 0) return;
  check(stop < total_steps, "--stop-at-step " + std::to_string(stop) + ": the run ends at step " +
                                std::to_string(total_steps) + " (" + run_length +
                                "), so it never pauses; --max-steps sets the run's length");
  check(stop > first_step, "--stop-at-step " + std::to_string(stop) + ": the run resumes after step " +
                               std::to_string(first_step) + " of " + resumed_from + ", past it already");
}

bool StopRules::stop_after(int64_t step, int64_t total_steps, bool at_progress_read) {
  signal_ = agreed_signal(at_progress_read);
  if (signal_) return true;
  // The run's last step ends it as a finished run (evaluated, exported), never as a pause.
  if (options_.stop_at_step > 0 && step == options_.stop_at_step && step < total_steps) paused_ = true;
  return paused_;
}

// One process reads its flag after every step: a host variable, no wait for the device. Ranks must all
// stop at the same step, or those going on wait forever in the next step's collectives; they agree by
// one all-reduce at the progress reads (every --log-every steps and at the epoch's end), where the host
// waits for the device anyway, so the steps in between stay free of host synchronisation. A stop then
// comes at most --log-every steps late, seconds on the runs that stopping matters for (Slurm gives
// 30 s or more between SIGTERM and SIGKILL; lower --log-every where steps are slow).
int StopRules::agreed_signal(bool at_progress_read) const {
  if (!options_.stop_signal) return 0;
  if (world_size_ == 1) return options_.stop_signal();
  if (!at_progress_read) return 0;
  // One slot a signal number: the sum says which signals any rank received, so every rank names the same.
  constexpr int64_t kSignals = 65;
  auto received = torch::zeros({kSignals}, torch::TensorOptions().dtype(torch::kFloat).device(device_));
  const int own = options_.stop_signal();
  if (own > 0 && own < kSignals) received[own] = 1;
  sum_over_ranks_(received);
  const auto any = received.cpu().nonzero();
  return any.size(0) > 0 ? static_cast<int>(any[0][0].item<int64_t>()) : 0;
}

void StopRules::diverged(const std::string& what, int64_t first_step) {
  const bool first = !diverged_at_step_;
  if (first) diverged_at_step_ = first_step;
  if (options_.on_divergence == OnDivergence::kStop) stop_diverged(what + "; stopped before saving anything from then on");
  if (first && options_.warns) std::cerr << "ptrain: warning: " << what << "; training on (--on-divergence warn)" << std::endl;
}

void StopRules::state_not_finite(const std::string& what, int64_t step) {
  if (!diverged_at_step_) diverged_at_step_ = step;
  if (options_.on_divergence == OnDivergence::kStop) stop_diverged(what);
  if (options_.warns) std::cerr << "ptrain: warning: " << what << std::endl;
}

void StopRules::stop_diverged(const std::string& what) {
  stopping_on_divergence_ = true;
  throw Error(what + kDivergenceAdvice);
}

}  // namespace ptrain::train
