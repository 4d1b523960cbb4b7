#include "ptrain/metrics/step_phases.h"

#include <algorithm>

#include "ptrain/core/error.h"
#include "ptrain/metrics/timer.h"

namespace ptrain::metrics {

namespace {
constexpr std::array<const char*, kStepPhaseCount> kPhaseKeys = {"data", "forward", "backward", "optimizer",
                                                                  "communication"};
size_t index_of(StepPhase phase) { return static_cast<size_t>(phase); }
}  // namespace

const char* phase_key(StepPhase phase) { return kPhaseKeys[index_of(phase)]; }

nlohmann::json StepPhaseMeans::to_json() const {
  if (steps == 0) return nullptr;
  nlohmann::json out = nlohmann::json::object();
  for (size_t i = 0; i < kPhaseKeys.size(); ++i) out[kPhaseKeys[i]] = seconds[i];
  return out;
}

StepPhaseTimer::StepPhaseTimer(const torch::Device& device) : device_(device) {}

void StepPhaseTimer::begin(StepPhase phase) {
  if (!counting_ && !capturing_) return;
  Pending p{phase, nullptr, {}, -1};
  if (capturing_) {
    p.interval = make_device_interval(device_);
    check(p.interval != nullptr, "step phase timer: a captured step needs a device clock");
    p.interval->begin();
    captured_.push_back(std::move(p));
    return;
  }
  if (!spare_.empty()) {
    p.interval = std::move(spare_.back());
    spare_.pop_back();
  } else {
    p.interval = make_device_interval(device_);
  }
  if (p.interval) {
    p.interval->begin();
  } else {
    p.host_begin = std::chrono::steady_clock::now();
  }
  pending_.push_back(std::move(p));
}

void StepPhaseTimer::end(StepPhase phase) {
  if (!counting_ && !capturing_) return;
  auto& open = capturing_ ? captured_ : pending_;
  for (auto it = open.rbegin(); it != open.rend(); ++it) {
    if (it->phase != phase || it->host_seconds >= 0) continue;
    if (it->interval) {
      it->interval->end();
      it->host_seconds = 0;  // marks it ended; the device's time is read in collect()
    } else {
      it->host_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - it->host_begin).count();
    }
    return;
  }
  throw Error(std::string("step phase timer: end(") + phase_key(phase) + ") without begin()");
}

void StepPhaseTimer::add_host_seconds(StepPhase phase, double seconds) {
  if (counting_) totals_[index_of(phase)] += seconds;
}

void StepPhaseTimer::end_step() {
  if (counting_) ++steps_;
  // Bounded: a long window's events are read (the oldest are long done) rather than piling up.
  if (pending_.size() > 4096) collect();
}

void StepPhaseTimer::add_replayed_steps(int64_t steps) {
  if (!counting_ || steps <= 0) return;
  for (auto& p : captured_) totals_[index_of(p.phase)] += static_cast<double>(steps) * p.interval->seconds();
  steps_ += steps;
}

void StepPhaseTimer::collect() {
  for (auto& p : pending_) {
    if (p.host_seconds < 0) continue;  // still open: a phase that began and has not ended
    totals_[index_of(p.phase)] += p.interval ? p.interval->seconds() : p.host_seconds;
    if (p.interval) spare_.push_back(std::move(p.interval));
  }
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [](const Pending& p) { return p.host_seconds >= 0; }),
                 pending_.end());
}

StepPhaseMeans StepPhaseTimer::means() {
  collect();
  StepPhaseMeans out;
  out.steps = steps_;
  if (steps_ > 0)
    for (size_t i = 0; i < totals_.size(); ++i) out.seconds[i] = totals_[i] / static_cast<double>(steps_);
  return out;
}

}  // namespace ptrain::metrics
