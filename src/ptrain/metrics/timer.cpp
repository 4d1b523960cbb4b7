#include "ptrain/metrics/timer.h"

#include <torch/cuda.h>

namespace ptrain::metrics {

void synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.has_index() ? device.index() : -1);
}

}  // namespace ptrain::metrics
