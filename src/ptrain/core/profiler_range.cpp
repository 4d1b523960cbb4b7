#include "ptrain/core/profiler_range.h"

#include <ATen/record_function.h>

namespace ptrain::compat {

ProfilerRange::ProfilerRange(const std::string& name) {
  auto record = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
  if (!record->isActive()) return;
  record->before(name);
  record_ = std::move(record);
}

// RecordFunction's destructor ends the range.
ProfilerRange::~ProfilerRange() = default;

}  // namespace ptrain::compat
