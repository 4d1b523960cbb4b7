// Where the time of a training step goes: waiting for data, forward, backward, the optimizer step, and the
// communication the step waits for (docs/metrics.md, step_phase_seconds). The device phases are timed on the
// device's own clock (CUDA events on the compute stream, the host clock on the CPU), so that timing them adds
// no host synchronisation to the step; they are read back only when the caller asks for the means.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

namespace ptrain::metrics {

enum class StepPhase { kData, kForward, kBackward, kOptimizer, kCommunication };
inline constexpr int kStepPhaseCount = 5;
const char* phase_key(StepPhase phase);  // "data", "forward", ...

// A pair of marks on a device's clock: begin() and end() record, seconds() waits for the end mark.
class DeviceInterval {
 public:
  virtual ~DeviceInterval() = default;
  virtual void begin() = 0;
  virtual void end() = 0;
  virtual double seconds() = 0;
};

// CUDA builds: a CUDA-event interval for CUDA devices (recorded on the current stream; inside a CUDA graph
// capture, recorded as graph nodes, so that every replay re-records it). Elsewhere: nullptr, and the caller
// times on the host. Defined in device_interval_cuda.cpp or device_interval_none.cpp, chosen at link time.
std::unique_ptr<DeviceInterval> make_device_interval(const torch::Device& device);

struct StepPhaseMeans {
  std::array<double, kStepPhaseCount> seconds{};  // mean seconds a step spends in each phase
  int64_t steps = 0;                              // the steps the means cover
  nlohmann::json to_json() const;                 // {"data": s, "forward": s, ...}; null when steps is 0
};

class StepPhaseTimer {
 public:
  explicit StepPhaseTimer(const torch::Device& device);

  // Only steps between start_counting() and the end contribute; before it the calls are free.
  void start_counting() { counting_ = true; }
  bool counting() const { return counting_; }

  // A device phase of the current step; pairs may repeat within a step (micro-batches) and add up.
  void begin(StepPhase phase);
  void end(StepPhase phase);
  // Time the host spent waiting, measured by the caller (the data loader's next batch).
  void add_host_seconds(StepPhase phase, double seconds);
  void end_step();

  // Reads every ended interval (waiting for the device where it is not done) into the totals: call where the
  // host waits for the device anyway (a progress read), so the read costs nothing.
  void collect();
  StepPhaseMeans means();  // collect(), then the means

  // CUDA graphs: while capturing, begin()/end() record intervals that belong to the graph (every replay
  // records them again). add_replayed_steps(n), once the host has waited for the device, counts n replayed
  // steps, each timed as the latest replay was: one sample a progress window.
  void set_capturing(bool capturing) { capturing_ = capturing; }
  void add_replayed_steps(int64_t steps);

 private:
  struct Pending {
    StepPhase phase;
    std::unique_ptr<DeviceInterval> interval;  // null: timed on the host
    std::chrono::steady_clock::time_point host_begin;
    double host_seconds = -1;
  };
  torch::Device device_;
  bool counting_ = false;
  bool capturing_ = false;
  std::vector<Pending> captured_;
  std::vector<Pending> pending_;
  std::vector<std::unique_ptr<DeviceInterval>> spare_;  // read intervals, reused so events are created once
  std::array<double, kStepPhaseCount> totals_{};
  int64_t steps_ = 0;
};

}  // namespace ptrain::metrics
