#include "ptrain/kernels/fp8_linear.h"

#include <torch/csrc/autograd/custom_function.h>

#include "ptrain/core/torch_compat.h"
#include "ptrain/kernels/fused.h"

namespace ptrain::kernels {

namespace {

constexpr int64_t kFp8Alignment = 16;

bool cast_dtype(c10::ScalarType t) { return t == torch::kFloat || t == torch::kHalf || t == torch::kBFloat16; }

// Whether GELU of h runs on ptrain's kernel, which also takes its output's amax (else LibTorch's gelu, no amax).
bool fused_gelu_applies(const torch::Tensor& h, bool allow_fused) {
  return allow_fused && fused::available(h.device()) && fused::kernel_dtype(h.scalar_type());
}

// y [rows, out] = x [rows, in] @ w [out, in]^T (+ bias) with both cast to E4M3. cuBLASLt's FP8 GEMM takes its
// first operand row-major and its second column-major (a [K, N] matrix stored as the contiguous [N, K]), so
// each cast also writes its operand's transpose, in the same pass: the backward's products need x and grad_y
// transposed and w as it is stored. The FP8 transposes of x and w are what the backward keeps: a byte an
// element instead of the activation's two or four.
class Fp8LinearFunction : public torch::autograd::Function<Fp8LinearFunction> {
 public:
  // x_amax: fp8_linear's, or an empty tensor (a custom function takes no undefined input). gelu: GELU (tanh) after
  // the product, returned with its output's amax (an empty tensor where the fused kernels do not run), and in the
  // backward GELU's gradient with its amax for the cast of the product's gradient (fp8_linear_gelu).
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                                const torch::Tensor& weight, const torch::Tensor& bias,
                                                const torch::Tensor& x_amax, bool allow_fused, bool gelu,
                                                const c10::intrusive_ptr<Fp8LinearHistories>& histories) {
    Fp8LinearHistories* delayed = histories.get();
    if (delayed != nullptr) delayed->allocate_on(x.device());
    const bool amax_given = delayed == nullptr && x_amax.numel() > 0;
    const Fp8Tensor xq = fp8_cast(x, /*e5m2=*/false, allow_fused,
                                  {/*transposed=*/true, false, delayed ? &delayed->input : nullptr,
                                   amax_given ? x_amax : torch::Tensor()});
    const Fp8Tensor wq =
        fp8_cast(weight, /*e5m2=*/false, allow_fused, {/*transposed=*/true, false, delayed ? &delayed->weight : nullptr});
    // w's contiguous [out, in] is w^T's column-major [in, out]. The bias joins in the GEMM's epilogue, in bf16 as
    // the output. Fast accumulation for the forward only, as torchao's default (its error stays within the
    // forward's bound; the gradients accumulate exactly).
    const bool has_bias = bias.numel() > 0;
    const auto bias16 = has_bias ? bias.to(torch::kBFloat16) : torch::Tensor();
    auto y = compat::scaled_mm(xq.data, wq.data.t(), xq.inv_scale, wq.inv_scale, bias16, torch::kBFloat16,
                               /*fast_accum=*/true);
    if (gelu) {
      ctx->save_for_backward({xq.transposed, xq.inv_scale, wq.transposed, wq.inv_scale, y});
    } else {
      ctx->save_for_backward({xq.transposed, xq.inv_scale, wq.transposed, wq.inv_scale});
    }
    const bool fused_gelu = gelu && fused_gelu_applies(y, allow_fused);
    ctx->saved_data["allow_fused"] = allow_fused;
    ctx->saved_data["gelu"] = gelu;
    ctx->saved_data["fused_gelu"] = fused_gelu;
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(weight.scalar_type());
    ctx->saved_data["b_dtype"] = static_cast<int64_t>(bias.scalar_type());
    ctx->saved_data["has_bias"] = has_bias;
    // The layer owns its histories; the capsule keeps them alive for the backward whatever becomes of it.
    if (delayed != nullptr) ctx->saved_data["histories"] = c10::IValue::make_capsule(histories);
    if (!gelu) return {y};
    if (!fused_gelu) {
      auto amax = torch::empty({0}, y.options().dtype(torch::kFloat));
      ctx->mark_non_differentiable({amax});
      return {torch::gelu(y, "tanh"), amax};
    }
    auto f = fused::gelu_tanh_forward(y, /*with_amax=*/true);
    ctx->mark_non_differentiable({f.amax});
    return {f.y, f.amax};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    // x_t [in, rows] and w_t [in, out]: row-major transposes, so x_t.t() and w_t.t() are column-major x and w.
    const torch::Tensor &x_t = saved[0], &x_inv = saved[1], &w_t = saved[2], &w_inv = saved[3];
    const auto x_dtype = static_cast<c10::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    const auto w_dtype = static_cast<c10::ScalarType>(ctx->saved_data["w_dtype"].toInt());
    const auto b_dtype = static_cast<c10::ScalarType>(ctx->saved_data["b_dtype"].toInt());
    if (!grads[0].defined()) return {torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(),
                                     torch::Tensor(), torch::Tensor()};
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    // The bias gradient (grad_y's column sums in fp32: no FP8 in it) read in the cast's pass over grad_y.
    c10::intrusive_ptr<Fp8LinearHistories> histories;
    if (ctx->saved_data.count("histories") != 0)
      histories = c10::static_intrusive_pointer_cast<Fp8LinearHistories>(ctx->saved_data["histories"].toCapsule());
    // With GELU, its gradient first: on the fused kernel, with its amax, which the cast takes under dynamic scaling.
    torch::Tensor grad_y = grads[0], grad_y_amax;
    if (ctx->saved_data["gelu"].toBool()) {
      if (ctx->saved_data["fused_gelu"].toBool()) {
        auto g = fused::gelu_tanh_backward(grads[0], saved[4], /*with_amax=*/!histories);
        grad_y = g.grad_x;
        grad_y_amax = g.amax;
      } else {
        grad_y = at::gelu_backward(grads[0], saved[4], "tanh");
      }
    }
    const Fp8Tensor gq = fp8_cast(grad_y, /*e5m2=*/true, ctx->saved_data["allow_fused"].toBool(),
                                  {/*transposed=*/true, /*column_sums=*/has_bias,
                                   histories ? &histories->grad_output : nullptr, grad_y_amax});
    // grad_x [rows, in] = grad_y [rows, out] @ w [out, in]; grad_w [out, in] = grad_y^T [out, rows] @ x [rows, in].
    auto grad_x = compat::scaled_mm(gq.data, w_t.t(), gq.inv_scale, w_inv, {}, x_dtype, /*fast_accum=*/false);
    auto grad_w = compat::scaled_mm(gq.transposed, x_t.t(), gq.inv_scale, x_inv, {}, w_dtype, /*fast_accum=*/false);
    const torch::Tensor grad_b = has_bias ? gq.column_sums.to(b_dtype) : torch::Tensor();
    return {grad_x, grad_w, grad_b, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// GELU on the fused kernel with its output's amax; LibTorch's backward.
class GeluTanhWithAmax : public torch::autograd::Function<GeluTanhWithAmax> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& h) {
    auto f = fused::gelu_tanh_forward(h, /*with_amax=*/true);
    ctx->save_for_backward({h});
    ctx->mark_non_differentiable({f.amax});
    return {f.y, f.amax};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {at::gelu_backward(grads[0], ctx->get_saved_variables()[0], "tanh")};
  }
};

// Fp8LinearFunction on x as [rows, in], its first output viewed back to x's leading dimensions.
torch::autograd::variable_list apply_fp8_linear(const torch::Tensor& x, const torch::Tensor& weight,
                                                const torch::Tensor& bias, const torch::Tensor& x_amax,
                                                bool allow_fused, bool gelu,
                                                const c10::intrusive_ptr<Fp8LinearHistories>& delayed) {
  auto sizes = x.sizes().vec();
  sizes.back() = weight.size(0);
  // LibTorch's Function::apply records the device of every tensor it is given, so "none" is an empty one.
  const auto bias_or_empty = bias.defined() ? bias : torch::empty({0}, weight.options());
  const auto amax_or_empty = x_amax.defined() ? x_amax : torch::empty({0}, x.options().dtype(torch::kFloat));
  auto out = Fp8LinearFunction::apply(x.reshape({-1, x.size(-1)}), weight, bias_or_empty, amax_or_empty, allow_fused,
                                      gelu, delayed);
  out[0] = out[0].view(sizes);
  return out;
}

}  // namespace

// Delayed scaling on LibTorch's ops (cuda/launch.h: Fp8DelayedScaling, which the fused kernels must match bit for
// bit): the last recorded amax (x's own on the first cast) into the history, the history's largest returned;
// x's amax recorded after.
torch::Tensor delayed_amax(const torch::Tensor& x_amax, Fp8AmaxHistory& delayed) {
  auto& state = delayed.state;
  TORCH_CHECK(state.defined() && state.dim() == 1 && state.numel() >= 2 && state.scalar_type() == torch::kFloat,
              "fp8 cast: a delayed scaling state is an fp32 vector of 2 or more");
  const int64_t history_len = state.numel() - 1;
  auto recorded = state.narrow(0, 0, 1);
  if (!delayed.primed) recorded.copy_(x_amax.reshape({1}));
  auto history = state.narrow(0, 1, history_len);
  history.copy_(torch::cat({recorded, state.narrow(0, 1, history_len - 1)}));
  recorded.copy_(x_amax.reshape({1}));
  delayed.primed = true;
  return history.max();
}

Fp8Tensor reference_fp8_cast(const torch::Tensor& x, bool e5m2, Fp8CastExtras extras) {
  const double fp8_max = compat::float8_max(e5m2);
  const auto x_amax = x.abs().max().to(torch::kFloat);
  const auto amax = extras.delayed != nullptr ? delayed_amax(x_amax, *extras.delayed) : x_amax;
  // data row-major whatever x's strides (to() keeps a transposed layout): the matrix products need it.
  // Tensor by tensor: LibTorch's scalar / tensor multiplies by a reciprocal, which rounds differently.
  const auto scale = torch::div(torch::full({}, fp8_max, amax.options()), amax.clamp_min(1e-12));
  const auto data = (x.contiguous().to(torch::kFloat) * scale).clamp(-fp8_max, fp8_max).to(compat::float8_dtype(e5m2));
  Fp8Tensor out{data, scale, scale.reciprocal(), {}, {}};
  if (extras.transposed) out.transposed = data.reshape({-1, data.size(-1)}).t().contiguous();
  if (extras.column_sums) out.column_sums = x.reshape({-1, x.size(-1)}).sum(0, false, torch::kFloat);
  return out;
}

Fp8Tensor fp8_cast(const torch::Tensor& x, bool e5m2, bool allow_fused, Fp8CastExtras extras) {
  // The reference computes x's amax itself: the same value as a given one, which is x's as written.
  if (!allow_fused || !fused::available(x.device()) || !fused::kernel_dtype(x.scalar_type()))
    return reference_fp8_cast(x, e5m2, extras);
  auto f = fused::fp8_cast(x, e5m2, extras);
  return {f.data, f.scale, f.inv_scale, f.transposed, f.column_sums};
}

bool fp8_shape_applies(int64_t rows, int64_t in, int64_t out) {
  return rows > 0 && in > 0 && out > 0 && rows % kFp8Alignment == 0 && in % kFp8Alignment == 0 &&
         out % kFp8Alignment == 0;
}

bool fp8_linear_applies(const torch::Tensor& x, const torch::Tensor& weight) {
  if (!compat::has_fp8_matmul() || !x.is_cuda() || weight.device() != x.device()) return false;
  if (x.dim() < 1 || weight.dim() != 2 || x.size(-1) != weight.size(1)) return false;
  if (!cast_dtype(x.scalar_type()) || !cast_dtype(weight.scalar_type())) return false;
  return fp8_shape_applies(x.numel() / std::max<int64_t>(1, x.size(-1)), weight.size(1), weight.size(0));
}

Fp8LinearHistories::Fp8LinearHistories(int64_t history_len) : history_len(history_len) {
  TORCH_CHECK(history_len >= 1, "fp8 delayed scaling: an amax history of ", history_len, " steps");
}

void Fp8LinearHistories::allocate_on(const torch::Device& device) {
  for (Fp8AmaxHistory* h : {&input, &weight, &grad_output}) {
    if (h->state.defined() && h->state.device() == device) continue;
    h->state = torch::zeros({history_len + 1}, torch::TensorOptions().dtype(torch::kFloat).device(device));
    h->primed = false;
  }
}

torch::Tensor fp8_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                         bool allow_fused, const c10::intrusive_ptr<Fp8LinearHistories>& delayed,
                         const torch::Tensor& x_amax) {
  if (!fp8_linear_applies(x, weight)) return torch::linear(x, weight, bias);
  return apply_fp8_linear(x, weight, bias, x_amax, allow_fused, /*gelu=*/false, delayed)[0];
}

Fp8Activation fp8_linear_gelu(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                              bool allow_fused, const c10::intrusive_ptr<Fp8LinearHistories>& delayed,
                              const torch::Tensor& x_amax) {
  if (!fp8_linear_applies(x, weight)) return gelu_tanh_for_fp8(torch::linear(x, weight, bias), allow_fused);
  auto out = apply_fp8_linear(x, weight, bias, x_amax, allow_fused, /*gelu=*/true, delayed);
  return {out[0], out[1].numel() > 0 ? out[1] : torch::Tensor()};
}

Fp8Activation gelu_tanh_for_fp8(const torch::Tensor& h, bool allow_fused) {
  if (!fused_gelu_applies(h, allow_fused)) return {torch::gelu(h, "tanh"), {}};
  auto out = GeluTanhWithAmax::apply(h);
  return {out[0], out[1]};
}

}  // namespace ptrain::kernels
