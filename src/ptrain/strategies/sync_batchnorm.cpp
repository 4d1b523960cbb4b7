#include "ptrain/strategies/sync_batchnorm.h"

#include "ptrain/core/error.h"
#include "ptrain/models/batch_norm.h"

namespace ptrain::strategies {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

torch::Tensor per_channel(const torch::Tensor& t) { return t.view({1, -1, 1, 1}); }

void all_reduce(distributed::ProcessGroup& group, torch::Tensor& t) {
  std::vector<torch::Tensor> one{t};
  group.all_reduce_sum(one).wait();
}

// Statistics in float32 at least, whatever the activation dtype, as cuDNN's batch norm keeps them.
torch::ScalarType stats_dtype(const torch::Tensor& x) {
  return x.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
}

class SyncBatchNormFunction : public torch::autograd::Function<SyncBatchNormFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, torch::Tensor weight, torch::Tensor bias,
                               torch::Tensor running_mean, torch::Tensor running_var, double momentum, double eps,
                               int64_t group_address) {
    auto& group = *reinterpret_cast<distributed::ProcessGroup*>(group_address);
    const std::vector<int64_t> dims{0, 2, 3};
    const int64_t channels = x.size(1);
    const auto xs = x.to(stats_dtype(x));
    // Two passes (sum, then squared deviations from the global mean) avoid the cancellation of
    // E[x^2] - E[x]^2, at the price of a second small all-reduce.
    auto sums = torch::cat({xs.sum(dims), torch::full({1}, static_cast<double>(x.numel() / channels), xs.options())});
    all_reduce(group, sums);
    const double count = sums[channels].item<double>();
    check(count > 1, "sync batch norm: the global batch has " + std::to_string(static_cast<int64_t>(count)) +
                         " values per channel; at least 2 are needed");
    const auto mean = sums.narrow(0, 0, channels) / count;
    auto squared = (xs - per_channel(mean)).pow(2).sum(dims);
    all_reduce(group, squared);
    const auto var = squared / count;
    const auto invstd = torch::rsqrt(var + eps);
    if (running_mean.defined()) {
      torch::NoGradGuard no_grad;
      running_mean.mul_(1 - momentum).add_(mean.to(running_mean.scalar_type()), momentum);
      running_var.mul_(1 - momentum).add_((var * (count / (count - 1))).to(running_var.scalar_type()), momentum);
    }
    auto y = (xs - per_channel(mean)) * per_channel(invstd);
    if (weight.defined()) y = y * per_channel(weight.to(y.scalar_type())) + per_channel(bias.to(y.scalar_type()));
    ctx->save_for_backward({x, weight, mean, invstd});
    ctx->saved_data["count"] = count;
    ctx->saved_data["group"] = group_address;
    return y.to(x.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto& weight = saved[1];
    const auto& mean = saved[2];
    const auto& invstd = saved[3];
    const double count = ctx->saved_data["count"].toDouble();
    auto& group = *reinterpret_cast<distributed::ProcessGroup*>(ctx->saved_data["group"].toInt());
    const std::vector<int64_t> dims{0, 2, 3};
    const int64_t channels = x.size(1);
    const auto dy = grad_outputs[0].to(mean.scalar_type());
    const auto xmu = x.to(mean.scalar_type()) - per_channel(mean);
    const auto sum_dy = dy.sum(dims);
    const auto sum_dy_xmu = (dy * xmu).sum(dims);
    // The affine gradients stay local: the DDP reducer averages them over ranks like any other gradient.
    torch::Tensor grad_weight, grad_bias;
    if (weight.defined()) {
      grad_weight = (sum_dy_xmu * invstd).to(weight.scalar_type());
      grad_bias = sum_dy.to(weight.scalar_type());
    }
    // The input gradient needs the sums over the global batch, since every sample moved the statistics.
    auto global = torch::cat({sum_dy, sum_dy_xmu});
    all_reduce(group, global);
    const auto mean_dy = global.narrow(0, 0, channels) / count;
    const auto mean_dy_xmu = global.narrow(0, channels, channels) / count;
    auto scale = invstd;
    if (weight.defined()) scale = scale * weight.to(invstd.scalar_type());
    auto grad_x = (dy - per_channel(mean_dy) - xmu * per_channel(invstd * invstd * mean_dy_xmu)) * per_channel(scale);
    return {grad_x.to(x.scalar_type()), grad_weight, grad_bias, torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor sync_batch_norm(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                              const torch::Tensor& running_mean, const torch::Tensor& running_var, double momentum,
                              double eps, distributed::ProcessGroup& group) {
  check(x.dim() == 4, "sync batch norm: expected a 4-D input (N, C, H, W), got " + std::to_string(x.dim()) + "-D");
  return SyncBatchNormFunction::apply(x, weight, bias, running_mean, running_var, momentum, eps,
                                      reinterpret_cast<int64_t>(&group));
}

SyncBatchNorm2dImpl::SyncBatchNorm2dImpl(const torch::nn::BatchNorm2dImpl& original,
                                         std::shared_ptr<distributed::ProcessGroup> group)
    : options_(original.options), group_(std::move(group)) {
  if (original.weight.defined()) {
    weight = register_parameter("weight", original.weight, original.weight.requires_grad());
    bias = register_parameter("bias", original.bias, original.bias.requires_grad());
  }
  if (original.running_mean.defined()) {
    running_mean = register_buffer("running_mean", original.running_mean);
    running_var = register_buffer("running_var", original.running_var);
    num_batches_tracked = register_buffer("num_batches_tracked", original.num_batches_tracked);
  }
  train(original.is_training());
}

torch::Tensor SyncBatchNorm2dImpl::forward(const torch::Tensor& x) {
  ++calls_;
  const bool tracking = options_.track_running_stats() && running_mean.defined();
  if (!is_training() && tracking) {
    return torch::batch_norm(x, weight, bias, running_mean, running_var, false, 0.0, options_.eps(),
                             at::globalContext().userEnabledCuDNN());
  }
  double momentum = 0.0;
  if (is_training() && tracking) {
    {
      torch::NoGradGuard no_grad;
      num_batches_tracked += 1;
    }
    // momentum = None asks for a cumulative average, as in torch::nn::BatchNorm.
    momentum = options_.momentum() ? *options_.momentum() : 1.0 / num_batches_tracked.item<double>();
  }
  return sync_batch_norm(x, weight, bias, tracking ? running_mean : torch::Tensor(),
                         tracking ? running_var : torch::Tensor(), momentum, options_.eps(), *group_);
}

namespace {

// ptrain's own BatchNorm2d stays in place and hands its normalisation over; the group outlives the model's
// training (the strategy holds both).
void take_over(models::BatchNorm2dImpl& norm, const std::shared_ptr<distributed::ProcessGroup>& group) {
  norm.take_over([group](models::BatchNorm2dImpl& bn, const torch::Tensor& x) {
    const bool tracking = bn.tracks_running_stats();
    if (!bn.is_training() && tracking) return bn.local_forward(x);
    const double momentum = bn.is_training() && tracking ? bn.count_batch_and_momentum() : 0.0;
    return sync_batch_norm(x, bn.weight, bn.bias, tracking ? bn.running_mean : torch::Tensor(),
                           tracking ? bn.running_var : torch::Tensor(), momentum, bn.options.eps(), *group);
  });
}

void convert_under(torch::nn::Module& parent, const std::string& prefix, const std::shared_ptr<distributed::ProcessGroup>& group,
                   std::vector<ConvertedNorm>& converted) {
  for (const auto& item : parent.named_children()) {
    const std::string name = prefix.empty() ? item.key() : prefix + "." + item.key();
    if (auto* own = item.value()->as<models::BatchNorm2dImpl>()) {
      take_over(*own, group);
    } else if (const auto* bn = item.value()->as<torch::nn::BatchNorm2dImpl>()) {
      auto sync = std::make_shared<SyncBatchNorm2dImpl>(*bn, group);
      parent.replace_module(item.key(), sync);
      converted.push_back({name, sync});
    } else {
      convert_under(*item.value(), name, group, converted);
    }
  }
}

}  // namespace

std::vector<ConvertedNorm> convert_sync_batchnorm(torch::nn::Module& root, std::shared_ptr<distributed::ProcessGroup> group) {
  check(group != nullptr, "sync batch norm needs a process group");
  std::vector<ConvertedNorm> converted;
  convert_under(root, "", group, converted);
  return converted;
}

}  // namespace ptrain::strategies
