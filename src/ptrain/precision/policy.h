// What each --precision mode means for the dtypes of parameters, activations, gradient communication
// and the optimizer's copy, and which of autocast, loss scaling and TF32 it turns on. Every other
// concern asks this struct instead of switching on the mode name.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <optional>
#include <string>
#include <vector>

namespace ptrain::precision {

enum class PrecisionMode { FP32, TF32, FP16, BF16, AMP_FP16, AMP_BF16, FP8 };

struct PrecisionPolicy {
  PrecisionMode mode = PrecisionMode::FP32;
  std::string name = "fp32";  // canonical name, as accepted by --precision
  c10::ScalarType param_dtype = c10::ScalarType::Float;    // model parameters
  c10::ScalarType compute_dtype = c10::ScalarType::Float;  // input/activation dtype fed to the model
  c10::ScalarType reduce_dtype = c10::ScalarType::Float;   // gradient communication
  c10::ScalarType master_dtype = c10::ScalarType::Float;   // optimizer's copy of the parameters
  bool master_weights = false;  // the optimizer keeps a master_dtype copy distinct from the parameters
  bool autocast = false;
  c10::ScalarType autocast_dtype = c10::ScalarType::Float;  // meaningful only when autocast is on
  bool loss_scaling = false;
  bool dynamic_loss_scale = false;            // true: GradScaler-style dynamic scale
  std::optional<double> static_loss_scale;    // set when --loss-scale gave a number
  // The dynamic scale's rules (--initial-loss-scale, --loss-scale-window, --hysteresis,
  // --consecutive-hysteresis, --min-loss-scale); the defaults are torch.amp.GradScaler's.
  double initial_loss_scale = 65536.0;
  int64_t loss_scale_window = 2000;
  int64_t hysteresis = 1;
  bool consecutive_hysteresis = true;
  double min_loss_scale = 0.0;
  bool allow_tf32 = false;
  // fp8: the matrix products of linear layers run in FP8 (E4M3 activations and weights, E5M2 gradients, each
  // tensor scaled by its own amax; kernels/fp8_linear.h), everything else as amp-bf16.
  bool fp8_matmuls = false;
};

// Resolves --precision NAME, --master-weights and --loss-scale for a device type.
//   names: fp32, tf32, fp16, bf16, amp-fp16, amp-bf16, fp8 (amp-bf16 with linear layers' matrix products in
//   FP8; a CUDA device only: require_fp8_device checks the rest); one alias: "no" -> fp32 (accelerate's spelling
//   for "no mixed precision"). No "amp" alias: its dtype differs between torch.autocast on CPU and CUDA.
//   loss_scale: "auto" (dynamic for amp-fp16 and for fp16 with master weights, none otherwise),
//   "dynamic", "none", or a positive finite number (a static scale).
// Throws ptrain::Error naming the flag (--precision, --master-weights, --loss-scale) when the
// combination is unknown or cannot run on the device.
PrecisionPolicy resolve_precision(const std::string& name, bool master_weights, c10::DeviceType device,
                                  const std::string& loss_scale = "auto");

// Throws ptrain::Error naming --precision fp8 where policy runs matrix products in FP8 and device cannot:
// a LibTorch without FP8 tensors and at::_scaled_mm (before 2.5), a device that is no CUDA GPU, or a GPU of
// compute capability below 8.9 (FP8 tensor cores arrived with Ada and Hopper). Nothing for other policies.
void require_fp8_device(const PrecisionPolicy& policy, const c10::Device& device);

// The name run records and reports give the policy: its mode's, "+master" with fp32 master weights
// ("bf16+master").
std::string record_name(const PrecisionPolicy& policy);

// The mode --precision NAME names ("no": fp32); an unknown name throws ptrain::Error naming --precision.
PrecisionMode mode_named(const std::string& name);
std::optional<PrecisionMode> precision_mode_or_none(const std::string& name);  // the same, none when unknown
// What a mode is, for readers of other frameworks' configs (DeepSpeed's fp16/bf16 blocks): the 16-bit
// float it trains in, if any; whether the parameters themselves are in it (pure fp16/bf16, where master
// weights apply); whether it autocasts.
std::optional<c10::ScalarType> half_dtype(PrecisionMode mode);
bool half_parameters(PrecisionMode mode);
bool autocasts(PrecisionMode mode);
// The mode training in `half` (Half or BFloat16), with autocast or with half parameters.
PrecisionMode half_mode(c10::ScalarType half, bool autocast);

// The canonical names, in the order of PrecisionMode (for --help and error messages).
const std::vector<std::string>& precision_names();
std::string to_string(PrecisionMode mode);

// The dtypes flags such as --param-dtype, --reduce-dtype and --buffer-dtype name ("fp32", "fp16",
// "bf16"), and back. An unknown name throws ptrain::Error.
c10::ScalarType dtype_named(const std::string& name);
const std::vector<std::string>& dtype_names();  // fp32, fp16, bf16
std::string dtype_name(c10::ScalarType dtype);

// Sets the process-wide TF32 switches of cuBLAS and cuDNN to policy.allow_tf32. Called once before
// training: PyTorch's default (cuDNN TF32 on, cuBLAS off) would make "fp32" a mixture.
void apply_global_math_mode(const PrecisionPolicy& policy);

}  // namespace ptrain::precision
