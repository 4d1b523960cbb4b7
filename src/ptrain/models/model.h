// What every zoo model offers to the trainer and to the parallel strategies.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ptrain::models {

// Told by a model whose units run themselves (Model::units_run_themselves) when each unit's forward
// starts and ends: how ZeRO-3 and FSDP gather and free a unit's parameters around it.
class UnitObserver {
 public:
  virtual ~UnitObserver() = default;
  virtual void before_unit(size_t index) = 0;
  // output: the unit's result, which the observer may hook (to gather the unit again for its backward).
  virtual void after_unit(size_t index, torch::Tensor& output) = 0;
};

// Which layers run their matrix products in FP8 under --precision fp8 (kernels/fp8_linear.h) and which keep
// bf16 (autocast), and why: what the run record's fp8_layers says.
struct Fp8Layers {
  int64_t fp8 = 0;   // linear layers whose products run in FP8
  int64_t kept = 0;  // linear and convolution layers kept in bf16
  std::string why;   // why those were kept; empty when none were
  bool head_in_fp8 = false;  // a language model's output head is among the FP8 layers (--fp8-head, shapes allowing)
};

// How --precision fp8 runs: GPT's head in FP8 too (--fp8-head); each cast scaled by an amax history rather than
// by its own amax (--fp8-scaling delayed, kernels/fp8_linear.h: Fp8LinearHistories).
struct Fp8Options {
  bool head = false;
  bool delayed_scaling = false;
};

// The fused paths --skip-fusions leaves out one by one while the fused kernels stay on: to measure what each
// brings, or to train without one that a GPU or a build gets wrong. Each applies where its kernels do.
struct FusionChoices {
  bool weight_casts = true;    // a unit's autocast weight casts in one kernel each way (kernels/parameter_cast.h)
  bool shortcut_norms = true;  // a downsampling block's last batch norm with its shortcut's, as one function
  bool stem_pool = true;       // the ImageNet stem's batch norm + ReLU + max pooling as one function
  bool residual_twins = true;  // a block output's two gradients summed in its batch norm's backward kernels
  bool bias_gradients = true;  // a linear layer's bias gradient (and GELU's backward before it) in one pass
                               // (kernels/linear.h)
  bool residual_adds = true;   // a transformer block's last residual add in the next LayerNorm's add + norm kernel
  bool fp8_amax = true;        // --precision fp8, dynamic scaling: an FP8 cast's amax from the LayerNorm or GELU
                               // kernel (forward or backward) that wrote its input, not from a pass of the cast's own
};

// The names --skip-fusions takes, in FusionChoices' order: weight-casts, shortcut-norms, stem-pool, residual-twins,
// bias-gradients, residual-adds, fp8-amax.
const std::vector<std::string>& fusion_names();
// Every fusion on but those named; an Error names a name that is none of fusion_names().
FusionChoices fusions_skipping(const std::vector<std::string>& names);

// "linear layers in FP8: 48, kept in bf16: 1 (lm_head: --fp8-head is off)": what the run's header and
// --dry-run print.
std::string describe_fp8_layers(const Fp8Layers& layers);

class Model : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(torch::Tensor x) = 0;

  // Recompute each block's activations in backward instead of keeping them (takes effect in training
  // mode with grad enabled).
  virtual void set_activation_checkpointing(bool /*on*/) {}

  // Use the fused CUDA kernels of kernels/ where they apply (ResNet: batch norm + ReLU, + residual), or
  // LibTorch's unfused ops. Models without fusable parts ignore it.
  virtual void set_fused_kernels(bool /*on*/) {}

  // With the fused kernels, recompute in the backward the output of each batch norm + ReLU that feeds a
  // convolution instead of keeping it (ResNet: kernels::batch_norm_relu_conv). Others ignore it.
  virtual void set_relu_recompute(bool /*on*/) {}

  // With the fused kernels and the ReLU recomputed, hand each convolution's output statistics to the batch
  // norm after it and apply that batch norm + ReLU in the next convolution's prologue, where cuDNN has
  // precompiled fused graphs (ResNet: kernels/batch_norm_relu.h on a ConvStatsResult). describe says what the
  // last training forward took, for the run record; empty for models without such convolutions.
  virtual void set_conv_bn_fusion(bool /*on*/) {}
  virtual std::string describe_conv_bn_fusion() const { return {}; }

  // Which fused paths run with the fused kernels on (ResNet: its four; GPT: the weight casts, the bias gradients
  // and the residual adds). Others ignore it.
  virtual void set_fusions(const FusionChoices& /*choices*/) {}
  // The fusions of fusion_names() this model has as it is set up (ResNet: stem-pool with the ImageNet stem only,
  // residual-twins without activation checkpointing), the ones --skip-fusions may name; none for models without.
  virtual std::vector<std::string> fusions() const { return {}; }
  // The fusions of fusions() that the last training forward never reached because another path ran in their
  // place (ResNet: shortcut-norms where every downsampling block took --conv-bn-fusion, whose shortcut batch
  // norm reads its convolution's statistics instead), so that skipping them measured nothing.
  virtual std::vector<std::string> fusions_bypassed() const { return {}; }

  // Which form of its ImageNet stem convolution the last training forward ran (ResNet: "7x7", or
  // "space-to-depth 4x4", kernels/stem_conv.h, with the fused kernels on); empty for other models.
  virtual std::string describe_stem_conv() const { return {}; }

  // --precision fp8: run the matrix products of linear layers in FP8 where the model has such a path (GPT: the
  // attention and MLP projections, and its head with options.head), off: in the autocast dtype. Returns what runs
  // where.
  // The default, for models without an FP8 path (ResNets, TorchScript, a user's module), changes nothing and
  // counts their convolutions and linear layers as kept in bf16.
  virtual Fp8Layers set_fp8_linear(bool on, const Fp8Options& options);

  virtual std::string name() const = 0;

  // The matrix products and convolutions of the forward on one sample of sample_shape ([channels, height, width]
  // for images, [tokens] for sequences), two FLOPs a multiply-add: what model FLOP utilisation counts
  // (metrics/flops.h). Null for models that cannot count theirs (TorchScript, a user's module).
  virtual std::optional<double> forward_flops(const std::vector<int64_t>& /*sample_shape*/) const {
    return std::nullopt;
  }

  // A new model of the same architecture and settings (activation checkpointing included) with its own,
  // freshly initialised parameters: what one-process data parallelism keeps a copy of per device.
  virtual std::shared_ptr<Model> make_replica() const;

  // The top-level blocks in forward order, together holding every parameter and buffer once: the units
  // that sharding, wrapping and pipelining strategies work with. A unit's parameters are named relative
  // to the unit name (unit "layer1.0" holds "conv1.weight", i.e. "layer1.0.conv1.weight"), except for
  // the "stem" and "head" units, which group top-level modules under their own names ("conv1.weight").
  virtual std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> units() = 0;

  // Runs unit `index` of units() alone; forward(x) is these applied in order, index 0 first.
  virtual torch::Tensor forward_unit(size_t index, torch::Tensor x) = 0;

  // A model whose forward calls its units itself, in any arrangement (a C++ module with units marked by
  // ptrain::fully_shard, api/user_model.h), instead of being their composition: strategies then run
  // forward() with an observer set, and forward_unit is not offered.
  virtual bool units_run_themselves() const { return false; }
  virtual void observe_units(UnitObserver* /*observer*/) {}
};

// conv's FLOPs on one sample of height x width (two a multiply-add), its output's height and width left in their
// place: the convolutions' share of Model::forward_flops. Throws ptrain::Error for padding other than zeros.
double conv2d_forward_flops(const torch::nn::Conv2dImpl& conv, int64_t& height, int64_t& width);

// As PyTorch's Module.to: floating-point parameters and buffers take dtype, the others (BatchNorm's
// num_batches_tracked) keep theirs; every tensor moves to device when one is given. In place (set_data),
// for module and all its descendants.
void to_floating_point(torch::nn::Module& module, const c10::optional<torch::Device>& device, torch::Dtype dtype,
                       bool non_blocking = false);

}  // namespace ptrain::models
