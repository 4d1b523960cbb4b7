#include "ptrain/models/gpt.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "ptrain/core/error.h"
#include "ptrain/core/text.h"  // defines: ends_with
#include "ptrain/core/torch_compat.h"  // defines: causal_attention
#include "ptrain/kernels/fp8_linear.h"             // defines: fp8_linear
#include "ptrain/kernels/layer_norm.h"             // defines: add_layer_norm
#include "ptrain/kernels/linear.h"                 // defines: linear, LinearActivation
#include "ptrain/kernels/parameter_cast.h"         // defines: ParameterCastScope
#include "ptrain/models/activation_checkpoint.h"  // defines: checkpoint

namespace ptrain::models {

namespace nn = torch::nn;

// Named rather than anonymous: classes with external linkage below hold these types, which GCC warns about
// (-Wsubobject-linkage) when a unity build includes this file into another.
namespace gpt_parts {

constexpr double kInitStd = 0.02;  // GPT-2's initialiser range
constexpr double kLayerNormEps = 1e-5;

// --fp8-scaling delayed's amax histories of one FP8 linear layer: made when it is switched on, kept (and their
// amaxes with them) while it stays on, dropped when it is off.
void keep_fp8_histories_if(bool on, c10::intrusive_ptr<kernels::Fp8LinearHistories>& histories) {
  if (!on) {
    histories.reset();
  } else if (!histories) {
    histories = c10::make_intrusive<kernels::Fp8LinearHistories>(kernels::kFp8AmaxHistory);
  }
}

// nn::Linear draws Kaiming-uniform weights on construction, serially, and GPT-2's initialisation draws
// them again: for billions of parameters that took minutes on the host before training could start. This
// Linear only allocates; Gpt's constructor draws each weight once, in parallel (fill_normal).
class Linear : public nn::Module {
 public:
  Linear(int64_t in, int64_t out, bool with_bias = true) {
    weight = register_parameter("weight", torch::empty({out, in}));
    if (with_bias) bias = register_parameter("bias", torch::empty({out}));
  }
  // With fp8 (--precision fp8), the product in FP8 where kernels::fp8_linear_applies (its casts on the fused
  // kernel with fused, scaled by amax histories with delayed_scaling), else LibTorch's product under the run's
  // autocast, its backward's bias gradient (and GELU's backward, with activation) on the fused column sums with
  // fused_bias_gradient (kernels/linear.h).
  // x_amax (may be undefined): x's amax from the kernel that wrote it, for the FP8 cast (kernels::fp8_linear).
  torch::Tensor forward(const torch::Tensor& x, kernels::LinearActivation activation = kernels::LinearActivation::kNone,
                        const torch::Tensor& x_amax = {}) {
    if (fp8) {
      auto y = kernels::fp8_linear(x, weight, bias, fused, fp8_histories, x_amax);
      return activation == kernels::LinearActivation::kGeluTanh ? torch::gelu(y, "tanh") : y;
    }
    return kernels::linear(x, kernels::ParameterCastScope::cast_of(weight), kernels::ParameterCastScope::cast_of(bias),
                           activation, fused_bias_gradient);
  }
  // GELU(the FP8 product) with GELU's output amax, and GELU's gradient with its amax in the backward
  // (kernels::fp8_linear_gelu): the MLP's c_fc under fp8-amax.
  kernels::Fp8Activation forward_gelu_fp8(const torch::Tensor& x, const torch::Tensor& x_amax) {
    return kernels::fp8_linear_gelu(x, weight, bias, fused, fp8_histories, x_amax);
  }
  bool fp8_shapes() const { return kernels::fp8_shape_applies(16, weight.size(1), weight.size(0)); }

  torch::Tensor weight, bias;
  bool fp8 = false, fused = false, fused_bias_gradient = false;
  c10::intrusive_ptr<kernels::Fp8LinearHistories> fp8_histories;
};

// Fills t with N(0, std^2) in fixed chunks, each from a generator of its own seeded by one draw from the
// global generator, chunks in parallel: as fast as the host has cores, and the same values for a seed
// whatever the number of threads.
void fill_normal(torch::Tensor& t, double std) {
  constexpr int64_t kChunk = int64_t{1} << 20;
  const auto base = static_cast<uint64_t>(
      torch::randint(std::numeric_limits<int64_t>::max(), {1}, torch::kLong).item<int64_t>());
  auto flat = t.view({-1});
  const int64_t chunks = (flat.numel() + kChunk - 1) / kChunk;
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      auto generator = at::make_generator<at::CPUGeneratorImpl>(base + static_cast<uint64_t>(c) * 0x9E3779B97F4A7C15ULL);
      flat.narrow(0, c * kChunk, std::min(kChunk, flat.numel() - c * kChunk)).normal_(0.0, std, generator);
    }
  });
}

// Multi-head causal self-attention: softmax(Q K^T / sqrt(d) + causal mask) V, computed explicitly on
// LibTorch 1.13 and fused on 2.x (core/torch_compat.h).
class CausalSelfAttention : public nn::Module {
 public:
  CausalSelfAttention(int64_t width, int64_t heads) : heads_(heads) {
    c_attn = register_module("c_attn", std::make_shared<Linear>(width, 3 * width));
    c_proj = register_module("c_proj", std::make_shared<Linear>(width, width));
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& x_amax = {}) {
    const int64_t batch = x.size(0), time = x.size(1), width = x.size(2);
    const int64_t head_dim = width / heads_;
    const auto qkv = c_attn->forward(x, kernels::LinearActivation::kNone, x_amax).split(width, /*dim=*/2);
    // [B, T, C] -> [B, heads, T, head_dim]
    const auto heads = [&](const torch::Tensor& t) { return t.view({batch, time, heads_, head_dim}).transpose(1, 2); };
    const auto q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
    const auto y = compat::causal_attention(q, k, v).transpose(1, 2).contiguous().view({batch, time, width});
    return c_proj->forward(y);
  }

  std::shared_ptr<Linear> c_attn, c_proj;

 private:
  int64_t heads_;
};

class Mlp : public nn::Module {
 public:
  explicit Mlp(int64_t width) {
    c_fc = register_module("c_fc", std::make_shared<Linear>(width, 4 * width));
    c_proj = register_module("c_proj", std::make_shared<Linear>(4 * width, width));
  }
  // With fp8_amax, the GELU between the two FP8 products also takes its output's amax, for c_proj's cast, and in
  // the backward its gradient's, for c_fc's.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& x_amax = {}) {
    if (fp8_amax) {
      const auto hidden = c_fc->forward_gelu_fp8(x, x_amax);
      return c_proj->forward(hidden.y, kernels::LinearActivation::kNone, hidden.amax);
    }
    return c_proj->forward(c_fc->forward(x, kernels::LinearActivation::kGeluTanh, x_amax));
  }

  std::shared_ptr<Linear> c_fc, c_proj;
  bool fp8_amax = false;
};

nn::LayerNorm layer_norm(int64_t width) {
  return nn::LayerNorm(nn::LayerNormOptions({width}).eps(kLayerNormEps));
}

// Holds top-level modules under their own names, for the "stem" and "head" units.
struct Group : nn::Module {
  Group(const std::string& a, std::shared_ptr<nn::Module> first, const std::string& b,
        std::shared_ptr<nn::Module> second) {
    register_module(a, std::move(first));
    register_module(b, std::move(second));
  }
};

// The dtype the next matrix product computes in: autocast's on CUDA, else the residual stream's.
c10::ScalarType compute_dtype(const torch::Tensor& x) {
  const auto device = x.device().type();
  return compat::autocast_enabled(device) ? compat::autocast_dtype(device) : x.scalar_type();
}

// layer_norm(x [+ branch]), fused with the add where the kernels apply (kernels/layer_norm.h); with_amax: with the
// output's amax for the FP8 cast after it.
kernels::AddLayerNorm norm(nn::LayerNorm& ln, const torch::Tensor& x, const torch::Tensor& branch, bool fused,
                           bool with_amax = false) {
  return kernels::add_layer_norm(x, branch, ln->weight, ln->bias, ln->options.eps(), compute_dtype(x), fused,
                                 with_amax);
}

}  // namespace gpt_parts
using namespace gpt_parts;

// One pre-LayerNorm transformer block: x + attn(ln_1(x)), then + mlp(ln_2(x)).
class GptBlock : public nn::Module {
 public:
  GptBlock(int64_t width, int64_t heads) {
    ln_1 = register_module("ln_1", layer_norm(width));
    attn = register_module("attn", std::make_shared<CausalSelfAttention>(width, heads));
    ln_2 = register_module("ln_2", layer_norm(width));
    mlp = register_module("mlp", std::make_shared<Mlp>(width));
  }
  torch::Tensor forward(torch::Tensor x) {
    if (!fused_) {
      x = x + attn->forward(ln_1->forward(x));
      return x + mlp->forward(ln_2->forward(x));
    }
    const auto out = forward_deferred(x, {});
    return out.residual + out.branch;
  }

  // The block with its last residual add left to the caller: residual + branch is the block's output. branch_in,
  // where defined, is the previous block's left-over branch: it joins x in ln_1's add + LayerNorm kernel, as the
  // attention's does in ln_2's, so that no residual add runs as a pass of its own, nor the sum of its two gradients.
  struct Deferred {
    torch::Tensor residual, branch;
  };
  Deferred forward_deferred(const torch::Tensor& x, const torch::Tensor& branch_in) {
    const auto n1 = norm(ln_1, x, branch_in, true, fp8_amax_);  // n1.sum is x itself without branch_in
    // The attention's residual add and ln_2 are one kernel; the normalised rows come out in the compute dtype.
    const auto h = norm(ln_2, n1.sum, attn->forward(n1.out, n1.out_amax), true, fp8_amax_);
    return {h.sum, mlp->forward(h.out, h.out_amax)};
  }

  // The attention's and the MLP's projections: what --precision fp8 runs in FP8.
  std::vector<Linear*> projections() const {
    return {attn->c_attn.get(), attn->c_proj.get(), mlp->c_fc.get(), mlp->c_proj.get()};
  }

  nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  bool fused_ = false;
  bool fp8_amax_ = false;  // the LayerNorms' kernels take their outputs' amax for the FP8 casts after them
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<Mlp> mlp;
};

std::optional<double> Gpt::forward_flops(const std::vector<int64_t>& sample_shape) const {
  check(sample_shape.size() == 1, "Gpt::forward_flops: a sample is [tokens]");
  const auto tokens = static_cast<double>(sample_shape[0]);
  const auto width = static_cast<double>(options_.width), layers = static_cast<double>(options_.layers);
  // Each token through a block's projections: qkv (3 d^2), the attention's output (d^2), the MLP's two (8 d^2);
  // then the head (d x vocabulary, the vocabulary's own columns: the padding is the GPU's convenience, not the
  // model's). Attention's own products, Q K^T and the weights times V, over the whole T x T square as PaLM
  // counts them (the causal half they skip is not subtracted).
  const double projections =
      tokens * (layers * 24.0 * width * width + 2.0 * width * static_cast<double>(options_.vocab_size));
  const double attention = layers * 4.0 * tokens * tokens * width;
  return projections + attention;
}

int64_t gpt_parameter_count(const GptOptions& o) {
  const int64_t c = o.width;
  const int64_t block = 2 * 2 * c                 // ln_1, ln_2
                        + c * 3 * c + 3 * c       // c_attn
                        + c * c + c               // attn.c_proj
                        + c * 4 * c + 4 * c       // c_fc
                        + 4 * c * c + c;          // mlp.c_proj
  return o.vocab_size * c + o.seq_len * c + o.layers * block + 2 * c + o.vocab_size * c;
}

void Gpt::set_fused_kernels(bool on) {
  fused_ = on;
  for (auto& block : blocks_) block->fused_ = on;
  configure_linears();
}

void Gpt::set_fusions(const FusionChoices& choices) {
  group_weight_casts_ = choices.weight_casts;
  fused_bias_gradients_ = choices.bias_gradients;
  defer_residual_adds_ = choices.residual_adds;
  fp8_amax_from_producers_ = choices.fp8_amax;
  configure_linears();
}

std::vector<std::string> Gpt::fusions() const {
  std::vector<std::string> names = {"weight-casts", "bias-gradients", "fp8-amax"};
  if (!checkpointing_) names.push_back("residual-adds");  // a checkpointed block recomputes from one input
  return names;
}

void Gpt::configure_linears() {
  const bool amax = producers_take_fp8_amax();
  for (auto& block : blocks_) {
    block->fp8_amax_ = amax;
    block->mlp->fp8_amax = amax;
    for (Linear* linear : block->projections()) {
      linear->fp8 = fp8_;
      linear->fused = fused_;
      linear->fused_bias_gradient = fused_ && fused_bias_gradients_;
      keep_fp8_histories_if(fp8_ && fp8_delayed_, linear->fp8_histories);
    }
  }
}

Fp8Layers Gpt::set_fp8_linear(bool on, const Fp8Options& options) {
  fp8_ = on;
  fp8_head_ = on && options.head;
  fp8_delayed_ = on && options.delayed_scaling;
  keep_fp8_histories_if(fp8_head_ && fp8_delayed_, head_histories_);
  configure_linears();
  Fp8Layers layers;
  if (!on) return layers;
  int64_t unaligned = 0;
  for (auto& block : blocks_) {
    for (const Linear* linear : block->projections()) linear->fp8_shapes() ? ++layers.fp8 : ++unaligned;
  }
  std::vector<std::string> why;
  if (unaligned > 0) {
    layers.kept += unaligned;
    why.push_back(std::to_string(unaligned) + " projections of width " + std::to_string(options_.width) +
                  ": features not multiples of 16, which FP8 GEMMs need");
  }
  // The head's rows come padded to a multiple of kVocabPadding with the fused kernels (on CUDA, where FP8 runs).
  const int64_t head_rows = fused_ ? (options_.vocab_size + kVocabPadding - 1) / kVocabPadding * kVocabPadding
                                   : options_.vocab_size;
  if (!fp8_head_) {
    ++layers.kept;
    why.push_back("lm_head: --fp8-head is off");
  } else if (!kernels::fp8_shape_applies(16, options_.width, head_rows)) {
    ++layers.kept;
    why.push_back("lm_head: " + std::to_string(head_rows) + " x " + std::to_string(options_.width) +
                  " not multiples of 16");
  } else {
    ++layers.fp8;
    layers.head_in_fp8 = true;
  }
  for (const auto& w : why) layers.why += (layers.why.empty() ? "" : "; ") + w;
  return layers;
}

Gpt::Gpt(const GptOptions& options) : options_(options) {
  const std::string where = "GPT '" + options.name + "': ";
  check(options.vocab_size > 0, where + "vocab_size must be positive, got " + std::to_string(options.vocab_size));
  check(options.seq_len > 0, where + "seq_len must be positive, got " + std::to_string(options.seq_len));
  check(options.layers > 0, where + "layers (--gpt-layers) must be positive, got " + std::to_string(options.layers));
  check(options.heads > 0, where + "heads (--gpt-heads) must be positive, got " + std::to_string(options.heads));
  check(options.width > 0 && options.width % options.heads == 0,
        where + "width (--gpt-width) " + std::to_string(options.width) + " must be a positive multiple of the " +
            std::to_string(options.heads) + " heads (--gpt-heads)");

  wte = register_module("wte", nn::Embedding(options.vocab_size, options.width));
  wpe = register_module("wpe", nn::Embedding(options.seq_len, options.width));
  auto h = register_module("h", nn::ModuleList());
  for (int64_t i = 0; i < options.layers; ++i) {
    blocks_.push_back(std::make_shared<GptBlock>(options.width, options.heads));
    h->push_back(blocks_.back());
  }
  ln_f = register_module("ln_f", layer_norm(options.width));
  lm_head = register_module("lm_head", nn::Linear(nn::LinearOptions(options.width, options.vocab_size).bias(false)));
  stem_ = std::make_shared<Group>("wte", wte.ptr(), "wpe", wpe.ptr());
  head_ = std::make_shared<Group>("ln_f", ln_f.ptr(), "lm_head", lm_head.ptr());

  // GPT-2's initialisation: N(0, 0.02) weights and embeddings, zero biases, LayerNorms at 1 and 0, and the
  // projections back into the residual stream scaled by 1/sqrt(2 * layers), one for each residual addition.
  torch::NoGradGuard no_grad;
  const double residual_std = kInitStd / std::sqrt(2.0 * static_cast<double>(options.layers));
  for (auto& item : named_parameters()) {
    const std::string& key = item.key();
    auto& p = item.value();
    const bool is_bias = ends_with(key, ".bias");
    const bool in_layer_norm = key.rfind("ln_f.", 0) == 0 || key.find(".ln_1.") != std::string::npos ||
                               key.find(".ln_2.") != std::string::npos;
    if (in_layer_norm) {
      is_bias ? p.zero_() : p.fill_(1.0);
    } else if (is_bias) {
      p.zero_();
    } else if (key.find("c_proj.weight") != std::string::npos) {
      fill_normal(p, residual_std);
    } else {
      fill_normal(p, kInitStd);
    }
  }
}

std::shared_ptr<Model> Gpt::make_replica() const {
  auto replica = std::make_shared<Gpt>(options_);
  replica->set_activation_checkpointing(checkpointing_);
  replica->set_fused_kernels(fused_);
  replica->group_weight_casts_ = group_weight_casts_;
  replica->fused_bias_gradients_ = fused_bias_gradients_;
  replica->defer_residual_adds_ = defer_residual_adds_;
  replica->fp8_amax_from_producers_ = fp8_amax_from_producers_;
  replica->set_fp8_linear(fp8_, {fp8_head_, fp8_delayed_});
  return replica;
}

std::vector<std::pair<std::string, std::shared_ptr<nn::Module>>> Gpt::units() {
  std::vector<std::pair<std::string, std::shared_ptr<nn::Module>>> result;
  result.emplace_back("stem", stem_);
  for (size_t i = 0; i < blocks_.size(); ++i) result.emplace_back("h." + std::to_string(i), blocks_[i]);
  result.emplace_back("head", head_);
  return result;
}

torch::Tensor Gpt::forward_unit(size_t index, torch::Tensor x) {
  const size_t count = blocks_.size() + 2;
  if (index >= count) {
    throw Error("Gpt::forward_unit: index " + std::to_string(index) + " is beyond the " + std::to_string(count) +
                " units");
  }
  if (index == 0) {
    // Checked without building messages on the way through: this runs every step.
    if (x.dim() != 2 || x.scalar_type() != torch::kInt64) {
      throw Error(name() + ": expects int64 tokens of shape [batch, time], got " +
                  std::string(c10::toString(x.scalar_type())) + " of shape " + c10::str(x.sizes()) +
                  " (a language model needs a token dataset)");
    }
    const int64_t time = x.size(1);
    if (time > options_.seq_len) {
      throw Error(name() + ": sequences of " + std::to_string(time) + " tokens are longer than its " +
                  std::to_string(options_.seq_len) + " positions");
    }
    const auto positions = torch::arange(time, torch::TensorOptions().dtype(torch::kInt64).device(x.device()));
    return wte->forward(x) + wpe->forward(positions);
  }
  if (index <= blocks_.size()) {
    GptBlock& block = *blocks_[index - 1];
    const auto casts = block_casts(block, x.device());
    if (checkpointing_ && is_training() && torch::GradMode::is_enabled()) {
      return checkpoint([&block](const torch::Tensor& in) { return block.forward(in); }, x, block);
    }
    return block.forward(x);
  }
  return forward_head(x, {});
}

// The block's weights cast as one group under autocast (with the fused kernels and the weight-casts fusion, and no
// FP8 linear, which casts its own); the head keeps autocast's cast, one tensor.
// Returned as a prvalue: the scope is built in the caller's variable (C++17 elides the copy it cannot make), where it
// registers itself as the innermost scope.
kernels::ParameterCastScope Gpt::block_casts(GptBlock& block, const torch::Device& device) const {
  const bool grouped = fused_ && group_weight_casts_ && !fp8_;
  return kernels::ParameterCastScope(
      grouped ? kernels::layer_parameters<Linear>(block) : std::vector<torch::Tensor>(), device, /*allow_fused=*/true);
}

// ln_f and lm_head on the residual stream x, with branch (the last block's left-over output, or undefined) added in
// ln_f's add + LayerNorm.
torch::Tensor Gpt::forward_head(const torch::Tensor& x, const torch::Tensor& branch) {
  const auto& head = lm_head->weight;
  const int64_t padding = (kVocabPadding - head.size(0) % kVocabPadding) % kVocabPadding;
  // Measured on an H200 in amp-bf16 for GPT-2 small: 30.8 ms a step in the head's three matrix products at
  // 50,257 rows (cuBLAS falls back to an unaligned sm75 kernel), against a few at 50,304.
  const auto n = fused_ ? norm(ln_f, x, branch, true, fp8_head_ && producers_take_fp8_amax()) : kernels::AddLayerNorm{};
  const auto normalized = fused_ ? n.out : ln_f->forward(x);
  const bool pad = fused_ && padding > 0 && head.is_cuda();
  if (fp8_head_) {
    return kernels::fp8_linear(normalized, pad ? at::constant_pad_nd(head, {0, 0, 0, padding}) : head, {}, fused_,
                               head_histories_, n.out_amax);
  }
  if (pad) return torch::linear(normalized, at::constant_pad_nd(head, {0, 0, 0, padding}));
  return lm_head->forward(normalized);
}

// Unit by unit, except with the fused kernels and the residual-adds fusion, without activation checkpointing: then
// each block's last residual add joins the next LayerNorm's kernel (GptBlock::forward_deferred). The sharding
// strategies run forward_unit, whose units each return the whole residual stream, since they gather and release a
// unit's parameters around it.
torch::Tensor Gpt::forward(torch::Tensor tokens) {
  if (!fused_ || !defer_residual_adds_ || checkpointing_) {
    const size_t count = blocks_.size() + 2;
    for (size_t i = 0; i < count; ++i) tokens = forward_unit(i, tokens);
    return tokens;
  }
  torch::Tensor x = forward_unit(0, tokens), branch;
  for (auto& block : blocks_) {
    const auto casts = block_casts(*block, x.device());
    auto out = block->forward_deferred(x, branch);
    x = std::move(out.residual);
    branch = std::move(out.branch);
  }
  return forward_head(x, branch);
}

}  // namespace ptrain::models
