// CPU builds: no CUDA graphs; every step runs eagerly.
#include "ptrain/train/captured_step.h"

namespace ptrain::train {

std::unique_ptr<CapturedStep> make_captured_step(const torch::Device&) { return nullptr; }
std::unique_ptr<RunStream> use_run_stream(const torch::Device&) { return nullptr; }

}  // namespace ptrain::train
