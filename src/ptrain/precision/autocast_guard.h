// Scoped autocast with the semantics of Python's torch.autocast: guards nest, an inner guard may turn
// autocast off for a region, and leaving a guard restores exactly what was there before.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace ptrain::precision {

class AutocastGuard {
 public:
  // dtype is ignored when enabled is false. Throws ptrain::Error, changing nothing, when this
  // release's autocast for the device refuses dtype (1.13's CPU autocast knows only bfloat16).
  AutocastGuard(c10::DeviceType device, bool enabled, c10::ScalarType dtype);
  ~AutocastGuard();

  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;
  AutocastGuard(AutocastGuard&&) = delete;
  AutocastGuard& operator=(AutocastGuard&&) = delete;

 private:
  c10::DeviceType device_;
  bool previous_enabled_;
  c10::ScalarType previous_dtype_;
};

}  // namespace ptrain::precision
