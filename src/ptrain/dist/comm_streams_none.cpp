// CPU-only builds: collectives run where they are issued; waiting on their work blocks the host.
#include "ptrain/dist/comm_streams.h"

namespace ptrain::dist {

namespace {

class HostOrdered final : public CommStreams {
 public:
  std::shared_ptr<void> after_compute(CommLane) override { return nullptr; }
  std::shared_ptr<void> on(CommLane) override { return nullptr; }
  void compute_waits(CommLane) override {}
};

}  // namespace

std::shared_ptr<CommStreams> make_comm_streams(const torch::Device&) { return std::make_shared<HostOrdered>(); }

}  // namespace ptrain::dist
