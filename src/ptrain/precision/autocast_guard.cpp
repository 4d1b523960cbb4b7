#include "ptrain/precision/autocast_guard.h"

#include "ptrain/core/error.h"
#include "ptrain/core/torch_compat.h"

namespace ptrain::precision {

AutocastGuard::AutocastGuard(c10::DeviceType device, bool enabled, c10::ScalarType dtype)
    : device_(device),
      previous_enabled_(compat::autocast_enabled(device)),
      previous_dtype_(compat::autocast_dtype(device)) {
  // A disabled region leaves the dtype alone: it is unused there, and 1.13's CPU autocast refuses
  // any dtype but bfloat16 even to switch itself off. The dtype is set first so that a refused one
  // leaves the state untouched.
  if (enabled) {
    try {
      compat::set_autocast_dtype(device, dtype);
    } catch (const c10::Error& e) {
      throw Error("autocast on " + c10::DeviceTypeName(device, true) + " cannot cast to " +
                  c10::toString(dtype) + " with LibTorch " + compat::torch_version() + ": " +
                  e.what_without_backtrace());
    }
  }
  compat::set_autocast_enabled(device, enabled);
  compat::enter_autocast_region();
}

AutocastGuard::~AutocastGuard() {
  // Casted copies of weights are cached for the outermost region only: dropping them earlier would recast
  // every weight in each inner region.
  compat::leave_autocast_region();
  compat::set_autocast_enabled(device_, previous_enabled_);
  compat::set_autocast_dtype(device_, previous_dtype_);
}

}  // namespace ptrain::precision
