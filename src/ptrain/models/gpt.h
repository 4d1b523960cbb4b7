// A GPT-2 style decoder-only language model (Radford et al. 2019): pre-LayerNorm blocks of causal
// self-attention and a 4x MLP with tanh-approximated GELU, learned positions, a final LayerNorm and a
// linear head. Module names follow GPT-2's ("wte", "h.0.attn.c_attn", "ln_f", ...) with Linear weights
// stored [out, in] as nn.Linear keeps them (not GPT-2's transposed Conv1D).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ptrain/kernels/fp8_linear.h"      // Fp8LinearHistories
#include "ptrain/kernels/parameter_cast.h"  // ParameterCastScope
#include "ptrain/models/model.h"

namespace ptrain::models {

struct GptOptions {
  std::string name = "gpt";  // what name() reports
  int64_t vocab_size = 256;
  int64_t seq_len = 64;      // the longest input: rows of the position embedding
  int64_t layers = 2;
  int64_t width = 64;        // embedding width, a multiple of heads
  int64_t heads = 4;
};

class GptBlock;

// forward(tokens): int64 [B, T] with T <= seq_len -> logits [B, T, vocab_size] in the parameters' dtype
// (or autocast's). units(): "stem" (wte, wpe), "h.0" ... "h.{layers-1}", "head" (ln_f, lm_head).
class Gpt : public Model {
 public:
  explicit Gpt(const GptOptions& options);

  torch::Tensor forward(torch::Tensor tokens) override;
  void set_activation_checkpointing(bool on) override { checkpointing_ = on; }
  // Fused residual add + LayerNorm (kernels/layer_norm.h); and on CUDA the head's logits come padded to a
  // multiple of kVocabPadding columns (zero weights; the loss reads only the vocabulary's): cuBLAS has no
  // fast kernel for GPT-2's odd 50,257 rows.
  void set_fused_kernels(bool on) override;
  // The attention's and MLP's projections in FP8 (kernels/fp8_linear.h), and lm_head with head; layers whose
  // features are not multiples of 16 keep bf16, as do calls whose rows (batch x tokens) are not.
  Fp8Layers set_fp8_linear(bool on, const Fp8Options& options) override;
  // With the fused kernels, its blocks' weight casts grouped (kernels/parameter_cast.h) unless weight_casts is
  // off, its blocks' linear layers' bias gradients on the fused column sums (kernels/linear.h) unless
  // bias_gradients is off, and each block's last residual add in the next LayerNorm's kernel (forward(), without
  // activation checkpointing) unless residual_adds is off.
  void set_fusions(const FusionChoices& choices) override;
  std::vector<std::string> fusions() const override;
  static constexpr int64_t kVocabPadding = 128;
  std::string name() const override { return options_.name; }
  std::optional<double> forward_flops(const std::vector<int64_t>& sample_shape) const override;
  std::shared_ptr<Model> make_replica() const override;
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> units() override;
  torch::Tensor forward_unit(size_t index, torch::Tensor x) override;

  const GptOptions& options() const { return options_; }

 private:
  GptOptions options_;
  bool checkpointing_ = false;
  bool fused_ = false;
  bool group_weight_casts_ = true;
  bool fused_bias_gradients_ = true;
  bool defer_residual_adds_ = true;
  bool fp8_amax_from_producers_ = true;
  // Under --precision fp8 with dynamic scaling and the fused kernels (fp8-amax): the LayerNorm and GELU kernels take
  // the amax of what they write, so that the FP8 casts after them read it once.
  bool producers_take_fp8_amax() const { return fused_ && fp8_ && !fp8_delayed_ && fp8_amax_from_producers_; }
  bool fp8_ = false, fp8_head_ = false;
  bool fp8_delayed_ = false;
  c10::intrusive_ptr<kernels::Fp8LinearHistories> head_histories_;  // --fp8-scaling delayed with --fp8-head
  void configure_linears();
  kernels::ParameterCastScope block_casts(GptBlock& block, const torch::Device& device) const;
  torch::Tensor forward_head(const torch::Tensor& x, const torch::Tensor& branch);
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  std::vector<std::shared_ptr<GptBlock>> blocks_;
  torch::nn::LayerNorm ln_f{nullptr};
  // Not tied to wte (GPT-2 ties them): sharding strategies cut the model into units that must own disjoint
  // parameters, and a weight shared by the first and the last unit would belong to both.
  torch::nn::Linear lm_head{nullptr};
  std::shared_ptr<torch::nn::Module> stem_, head_;  // top-level modules grouped for units()
};

// Parameters of a GPT with these options (embeddings, blocks, final LayerNorm and untied head).
int64_t gpt_parameter_count(const GptOptions& options);

}  // namespace ptrain::models
