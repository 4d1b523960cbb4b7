// The half of compat::start_profiler_trace / stop_profiler_trace that differs between builds: Kineto in CUDA
// builds (torch_compat_cuda.cpp), the legacy profiler in CPU builds (torch_compat_none.cpp). torch_compat.cpp
// keeps the rest (one trace at a time, the file written whole).
#pragma once

#include <string>

namespace ptrain::compat::profiler_session {

void start(bool with_cuda);
// Stops the profiler and writes its trace to file. Throws (c10::Error or ptrain::Error) if it cannot.
void stop_into(const std::string& file);

}  // namespace ptrain::compat::profiler_session
