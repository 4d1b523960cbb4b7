#include "ptrain/core/error.h"
#include "ptrain/strategies/single_device.h"
#include "ptrain/strategies/strategy.h"

namespace ptrain::strategies {

std::unique_ptr<Strategy> make_strategy(const std::string& name, torch::Device device) {
  if (name == "single") return std::make_unique<SingleDevice>(device);
  throw Error("--strategy: unknown strategy '" + name + "' (known: single)");
}

}  // namespace ptrain::strategies
