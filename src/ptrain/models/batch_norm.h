// BatchNorm2d with torch::nn::BatchNorm2d's parameters, buffers, names, defaults and numerics, whose
// normalisation a parallel strategy can take over (synchronised BatchNorm). torch::nn::BatchNorm2d
// offers no such seam: the zoo's models call their norm layers through typed member handles, so a
// replaced registered child never reaches their forward, and a subclass of BatchNorm2dImpl does not
// link against LibTorch 1.13 (BatchNormImplBase<2>::pretty_print is not exported).
#pragma once

#include <functional>

#include <torch/torch.h>

#include "ptrain/kernels/conv_stats.h"
#include "ptrain/models/model.h"

namespace ptrain::models {

class BatchNorm2dImpl : public torch::nn::Module {
 public:
  explicit BatchNorm2dImpl(int64_t num_features) : BatchNorm2dImpl(torch::nn::BatchNormOptions(num_features)) {}
  explicit BatchNorm2dImpl(const torch::nn::BatchNormOptions& options);

  torch::Tensor forward(const torch::Tensor& x);

  // Replaces the normalisation of forward (training and evaluation alike) until reset with nullptr.
  using Normalize = std::function<torch::Tensor(BatchNorm2dImpl& norm, const torch::Tensor& x)>;
  void take_over(Normalize normalize) { normalize_ = std::move(normalize); }
  bool taken_over() const { return static_cast<bool>(normalize_); }

  // What forward does when nobody took over: torch::nn::BatchNorm2d's forward.
  torch::Tensor local_forward(const torch::Tensor& x);

  // relu(forward(x) [+ residual]); residual may be undefined. In training, with fused kernels allowed
  // and nobody taking over, one fused kernel chain (kernels/batch_norm_relu.h) where it applies; forward
  // alone takes the same kernels without the ReLU. twin (may be null): see kernels::batch_norm_relu.
  torch::Tensor forward_relu(const torch::Tensor& x, const torch::Tensor& residual = {}, torch::Tensor* twin = nullptr);
  void set_fused_kernels(bool on) { fused_kernels_ = on; }
  // Which of the fused functions below it may take (stem_pool, shortcut_norms; the others are not its own).
  void set_fusions(const FusionChoices& choices) { fusions_ = choices; }

  // max_pool2d(forward_relu(x), kernel, stride, padding): ResNet's ImageNet stem. Where the fused kernels apply
  // (and the stem-pool fusion is on), one fused function (kernels::batch_norm_relu_max_pool); else forward_relu,
  // then max pooling (its fused kernels in training with the fused kernels on).
  torch::Tensor forward_relu_max_pool(const torch::Tensor& x, int64_t kernel, int64_t stride, int64_t padding);

  // relu(forward(x) + shortcut_norm.forward(shortcut_x)): a block's last batch norm with its shortcut's. Where the
  // fused kernels apply to both (and the shortcut-norms fusion is on), one fused function
  // (kernels::batch_norm_add_batch_norm_relu), which never writes the shortcut's output; else the shortcut's
  // forward, then forward_relu with it as the residual. twin: as forward_relu's.
  torch::Tensor forward_relu_add_norm(const torch::Tensor& x, BatchNorm2dImpl& shortcut_norm,
                                      const torch::Tensor& shortcut_x, torch::Tensor* twin = nullptr);

  // conv(forward_relu(x)) for a bias-free, zero-padded convolution; where the fused kernels apply and
  // relu recomputation is on, the ReLU's output is not kept for the backward but recomputed
  // (kernels::batch_norm_relu_conv).
  torch::Tensor forward_relu_conv(const torch::Tensor& x, torch::nn::Conv2dImpl& conv);
  // conv's weight as autocast would cast it for activations like x (itself when it has x's dtype): the live
  // kernels::ParameterCastScope's cast where one holds it.
  static torch::Tensor conv_weight_like(const torch::nn::Conv2dImpl& conv, const torch::Tensor& x);
  void set_relu_recompute(bool on) { relu_recompute_ = on; }

  // The same three (forward, forward_relu, forward_relu_conv) on the output of a convolution that returned its
  // statistics (kernels::conv_with_stats): the batch norm takes them instead of a pass over in.y, and a batch
  // norm + ReLU feeding a convolution runs in that convolution's prologue (kernels/batch_norm_relu.h). For
  // activations accepts_conv_stats said yes to; others are refused with an Error.
  torch::Tensor forward_from_stats(const kernels::ConvStatsResult& in);
  torch::Tensor forward_relu_from_stats(const kernels::ConvStatsResult& in, const torch::Tensor& residual = {},
                                        torch::Tensor* twin = nullptr);
  kernels::ConvStatsResult forward_relu_conv_from_stats(const kernels::ConvStatsResult& in,
                                                          torch::nn::Conv2dImpl& conv);
  // Whether it takes statistics from a convolution for activations like x: training, fused kernels, ReLU
  // recomputation (the fusion never writes the ReLU's output) and the fusion on, nobody taking over.
  bool accepts_conv_stats(const torch::Tensor& x) const { return conv_stats_ && relu_recompute_ && fused_applies(x, {}); }
  void set_conv_stats(bool on) { conv_stats_ = on; }

  // The momentum of this training step's running-statistics update (a cumulative average when the
  // options have none); counts the step in num_batches_tracked. Training mode with tracking only.
  double count_batch_and_momentum();
  bool tracks_running_stats() const { return options.track_running_stats() && running_mean.defined(); }

  torch::nn::BatchNormOptions options;
  torch::Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 private:
  // Training with fused kernels on and nobody taking over, for tensors the kernels take (residual may be
  // undefined). Throws where x has one value per channel, as local_forward does in training.
  bool fused_applies(const torch::Tensor& x, const torch::Tensor& residual) const;
  // As torch::nn::BatchNorm2d in training: a channel of one value has no variance to normalise by (its unbiased
  // running variance would be 0/0), so such a batch is refused rather than turned into NaN statistics.
  void require_values_to_normalise(const torch::Tensor& x) const;
  // Throws unless accepts_conv_stats(y).
  void require_conv_stats(const torch::Tensor& y) const;

  Normalize normalize_;
  bool fused_kernels_ = false;
  FusionChoices fusions_;
  bool relu_recompute_ = false;
  bool conv_stats_ = false;
};

TORCH_MODULE(BatchNorm2d);

}  // namespace ptrain::models
