// CPU builds: no device clock but the host's (StepPhaseTimer times on the host).
#include "ptrain/metrics/step_phases.h"

namespace ptrain::metrics {

std::unique_ptr<DeviceInterval> make_device_interval(const torch::Device&) { return nullptr; }

}  // namespace ptrain::metrics
