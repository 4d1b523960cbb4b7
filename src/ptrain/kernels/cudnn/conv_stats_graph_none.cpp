// CUDA builds that found no cuDNN headers (cudnn_backend.h): the fusion is reported unsupported, so
// kernels::conv_stats takes LibTorch's ops.
#include "ptrain/kernels/cudnn/conv_stats_graph.h"

#include <stdexcept>

namespace ptrain::kernels::cudnn {

namespace {
const char* const kWhyNot = "this build found no cuDNN headers (cudnn_backend.h) to build its fused graphs with";
}

ConvStatsPlanInfo conv_stats_plan(const ConvStatsShape&) {
  ConvStatsPlanInfo info;
  info.why_not = kWhyNot;
  return info;
}

void conv_stats(const ConvStatsShape&, const void*, const void*, const void*, const void*, void*, float*, float*, void*,
                cudaStream_t) {
  throw std::runtime_error(kWhyNot);
}

}  // namespace ptrain::kernels::cudnn
