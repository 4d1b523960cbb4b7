// CPU-only builds: collectives run where they are issued; waiting on their work blocks the host.
#include "ptrain/distributed/comm_streams.h"

namespace ptrain::distributed {

std::shared_ptr<CommStreams> make_comm_streams(const torch::Device&) { return std::make_shared<HostOrderedStreams>(); }

}  // namespace ptrain::distributed
