#include "ptrain/precision/policy.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "ptrain/core/cuda_runtime.h"
#include "ptrain/core/error.h"
#include "ptrain/core/torch_compat.h"

namespace ptrain::precision {
namespace {

std::string joined_names() {
  std::string out;
  for (const auto& n : precision_names()) out += (out.empty() ? "" : ", ") + n;
  return out;
}

PrecisionMode parse_mode(const std::string& name) {
  if (name == "fp32" || name == "no") return PrecisionMode::FP32;
  if (name == "tf32") return PrecisionMode::TF32;
  if (name == "fp16") return PrecisionMode::FP16;
  if (name == "bf16") return PrecisionMode::BF16;
  if (name == "amp-fp16") return PrecisionMode::AMP_FP16;
  if (name == "amp-bf16") return PrecisionMode::AMP_BF16;
  if (name == "fp8") return PrecisionMode::FP8;
  throw Error("--precision: unknown mode '" + name + "'; expected one of " + joined_names() +
              " (or 'no' for fp32)");
}

std::string device_name(c10::DeviceType device) { return c10::DeviceTypeName(device, /*lower_case=*/true); }

void refuse_unsupported_on_device(PrecisionMode mode, c10::DeviceType device) {
  const bool cuda = device == c10::DeviceType::CUDA;
  if (mode == PrecisionMode::FP8 && !cuda) {
    throw Error("--precision fp8 needs a CUDA GPU of compute capability 8.9 or later (Ada, Hopper) and a LibTorch "
                "with FP8 matrix products (2.5 or later); the " + device_name(device) +
                " has no FP8 tensor cores: use --precision amp-bf16");
  }
  if (mode == PrecisionMode::TF32 && !cuda) {
    throw Error("--precision tf32 needs a CUDA device: TensorFloat-32 is a mode of NVIDIA tensor cores "
                "(Ampere and later), and the " + device_name(device) + " has none; use --precision fp32");
  }
  if (cuda || compat::cpu_autocast_supports_fp16()) return;
  if (mode == PrecisionMode::AMP_FP16) {
    throw Error("--precision amp-fp16 is not available on the " + device_name(device) + " with LibTorch " +
                compat::torch_version() +
                ": its CPU autocast casts only to bfloat16 (float16 arrived in 2.3); use --precision amp-bf16");
  }
  if (mode == PrecisionMode::FP16) {
    throw Error("--precision fp16 is not available on the " + device_name(device) + " with LibTorch " +
                compat::torch_version() +
                ": its CPU kernels for convolution, matmul and batch norm have no float16 version; "
                "use --precision bf16");
  }
}

struct LossScaleChoice {
  bool enabled = false;
  bool dynamic = false;
  std::optional<double> static_scale;
};

LossScaleChoice parse_loss_scale(const std::string& text, PrecisionMode mode, bool master_weights) {
  if (text == "auto") {
    const bool on = mode == PrecisionMode::AMP_FP16 || (mode == PrecisionMode::FP16 && master_weights);
    return {on, on, std::nullopt};
  }
  if (text == "dynamic") return {true, true, std::nullopt};
  if (text == "none") return {};
  const char* begin = text.c_str();
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(begin, &end);
  // The scale multiplies the loss as a float: a larger one would fail in LibTorch, naming no flag. strtod also
  // reads hexadecimal (0x400 is 1024): numbers are decimal, as every flag's (config/number_checks.h).
  if (text.empty() || end != begin + text.size() || errno == ERANGE || !std::isfinite(value) || value <= 0.0 ||
      value > std::numeric_limits<float>::max() || text.find_first_of("xX") != std::string::npos) {
    throw Error("--loss-scale: '" + text +
                "' is neither auto, dynamic, none nor a positive decimal number a float holds (a static scale, at "
                "most 3.40282e+38)");
  }
  return {true, false, value};
}

}  // namespace

const std::vector<std::string>& precision_names() {
  static const std::vector<std::string> names{"fp32", "tf32", "fp16", "bf16", "amp-fp16", "amp-bf16", "fp8"};
  return names;
}

PrecisionMode mode_named(const std::string& name) { return parse_mode(name); }

std::optional<PrecisionMode> precision_mode_or_none(const std::string& name) {
  try {
    return parse_mode(name);
  } catch (const Error&) {
    return std::nullopt;
  }
}

std::optional<c10::ScalarType> half_dtype(PrecisionMode mode) {
  switch (mode) {
    case PrecisionMode::FP16:
    case PrecisionMode::AMP_FP16: return c10::ScalarType::Half;
    case PrecisionMode::BF16:
    case PrecisionMode::AMP_BF16:
    case PrecisionMode::FP8: return c10::ScalarType::BFloat16;
    case PrecisionMode::FP32:
    case PrecisionMode::TF32: break;
  }
  return std::nullopt;
}

bool half_parameters(PrecisionMode mode) { return mode == PrecisionMode::FP16 || mode == PrecisionMode::BF16; }

bool autocasts(PrecisionMode mode) {
  return mode == PrecisionMode::AMP_FP16 || mode == PrecisionMode::AMP_BF16 || mode == PrecisionMode::FP8;
}

PrecisionMode half_mode(c10::ScalarType half, bool autocast) {
  check(half == c10::ScalarType::Half || half == c10::ScalarType::BFloat16, "half_mode: not a 16-bit float");
  if (half == c10::ScalarType::Half) return autocast ? PrecisionMode::AMP_FP16 : PrecisionMode::FP16;
  return autocast ? PrecisionMode::AMP_BF16 : PrecisionMode::BF16;
}

std::string record_name(const PrecisionPolicy& policy) {
  return to_string(policy.mode) + (policy.master_weights ? "+master" : "");
}

std::string to_string(PrecisionMode mode) { return precision_names().at(static_cast<size_t>(mode)); }

PrecisionPolicy resolve_precision(const std::string& name, bool master_weights, c10::DeviceType device,
                                  const std::string& loss_scale) {
  const PrecisionMode mode = parse_mode(name);
  const bool pure_half = mode == PrecisionMode::FP16 || mode == PrecisionMode::BF16;
  if (master_weights && !pure_half) {
    throw Error("--master-weights applies only to --precision fp16 or bf16: with " + to_string(mode) +
                " the parameters are already float32");
  }
  refuse_unsupported_on_device(mode, device);

  PrecisionPolicy p;
  p.mode = mode;
  p.name = to_string(mode);
  switch (mode) {
    case PrecisionMode::FP32:
      break;
    case PrecisionMode::TF32:
      p.allow_tf32 = true;
      break;
    case PrecisionMode::FP16:
    case PrecisionMode::BF16: {
      const auto half = mode == PrecisionMode::FP16 ? c10::ScalarType::Half : c10::ScalarType::BFloat16;
      p.param_dtype = p.compute_dtype = p.reduce_dtype = half;
      p.master_weights = master_weights;
      p.master_dtype = master_weights ? c10::ScalarType::Float : half;
      break;
    }
    case PrecisionMode::AMP_FP16:
    case PrecisionMode::AMP_BF16:
      p.autocast = true;
      p.autocast_dtype = mode == PrecisionMode::AMP_FP16 ? c10::ScalarType::Half : c10::ScalarType::BFloat16;
      break;
    case PrecisionMode::FP8:
      // amp-bf16 around the FP8 matrix products: bf16 keeps fp32's range, so no loss scale is needed (the FP8
      // tensors are scaled by their own amax instead).
      p.autocast = true;
      p.autocast_dtype = c10::ScalarType::BFloat16;
      p.fp8_matmuls = true;
      break;
  }
  const LossScaleChoice ls = parse_loss_scale(loss_scale, mode, master_weights);
  p.loss_scaling = ls.enabled;
  p.dynamic_loss_scale = ls.dynamic;
  p.static_loss_scale = ls.static_scale;
  return p;
}

void require_fp8_device(const PrecisionPolicy& policy, const c10::Device& device) {
  if (!policy.fp8_matmuls) return;
  if (!compat::has_fp8_matmul()) {
    throw Error("--precision fp8 needs a LibTorch with FP8 tensors and matrix products (at::_scaled_mm, 2.5 or "
                "later); this ptrain was built against LibTorch " + compat::torch_version() +
                ": use --precision amp-bf16");
  }
  if (!device.is_cuda()) refuse_unsupported_on_device(PrecisionMode::FP8, device.type());
  const int capability = cuda_runtime::compute_capability(device.has_index() ? device.index() : 0);
  if (capability < 89) {
    throw Error("--precision fp8 needs a GPU of compute capability 8.9 or later (Ada, Hopper: FP8 tensor cores); " +
                device.str() + " is " + std::to_string(capability / 10) + "." + std::to_string(capability % 10) +
                ": use --precision amp-bf16");
  }
}

void apply_global_math_mode(const PrecisionPolicy& policy) {
  // The switches are plain flags of the global context, present in CPU builds too, where they have no effect.
  compat::set_allow_tf32(policy.allow_tf32);
}

const std::vector<std::string>& dtype_names() {
  static const std::vector<std::string> names{"fp32", "fp16", "bf16"};
  return names;
}

c10::ScalarType dtype_named(const std::string& name) {
  if (name == "fp32") return c10::ScalarType::Float;
  if (name == "fp16") return c10::ScalarType::Half;
  if (name == "bf16") return c10::ScalarType::BFloat16;
  throw Error("unknown dtype '" + name + "' (known: fp32, fp16, bf16)");
}

std::string dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::Float: return "fp32";
    case c10::ScalarType::Half: return "fp16";
    case c10::ScalarType::BFloat16: return "bf16";
    default: return c10::toString(dtype);
  }
}

}  // namespace ptrain::precision
