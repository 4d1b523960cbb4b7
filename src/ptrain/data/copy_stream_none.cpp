// CPU builds: no CUDA streams; a loader for a CUDA device is refused.
#include "ptrain/core/error.h"
#include "ptrain/data/copy_stream.h"

namespace ptrain::data {

std::unique_ptr<CopyStream> make_copy_stream(const torch::Device& device) {
  throw Error("loader: device " + device.str() + " requested but ptrain was built without CUDA");
}

}  // namespace ptrain::data
