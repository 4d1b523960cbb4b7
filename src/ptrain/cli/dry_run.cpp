#include "ptrain/cli/dry_run.h"

#include <iomanip>
#include <numeric>
#include <sstream>

#include "ptrain/data/registry.h"
#include "ptrain/estimate/estimate.h"
#include "ptrain/estimate/run_length.h"
#include "ptrain/models/model_summary.h"
#include "ptrain/models/torchscript_model.h"
#include "ptrain/models/zoo.h"
#include "ptrain/strategies/ddp.h"
#include "ptrain/strategies/fsdp.h"
#include "ptrain/strategies/sharding.h"
#include "ptrain/train/plan.h"
#include "ptrain/train/trainer.h"

namespace ptrain::cli {
namespace {

std::string mib(int64_t bytes) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(1) << static_cast<double>(bytes) / (1 << 20) << " MiB";
  return out.str();
}

// The buckets ddp all-reduces and ZeRO-1/2 reduce (and shard), made as the strategies make them, in the
// order backward fills them.
std::string describe_buckets(models::Model& model, const train::Plan& plan, int64_t ranks) {
  const strategies::StrategyOptions& o = plan.strategy_options;
  std::vector<torch::Tensor> params;
  for (const auto& p : model.parameters())
    if (p.requires_grad()) params.push_back(p);
  const bool sharded = plan.strategy.shards_optimizer_state();
  std::ostringstream out;
  std::vector<std::vector<size_t>> groups;
  if (sharded) {
    groups = strategies::group_by_size(params, strategies::megabytes_to_bytes(o.reduce_bucket_mb));
    out << groups.size() << " buckets of at most " << o.reduce_bucket_mb << " MiB, each sharded over "
        << ranks << " ranks";
  } else {
    const double first_mb = strategies::DdpOptions{}.first_bucket_mb;
    groups = strategies::ddp_buckets(params, strategies::megabytes_to_bytes(first_mb),
                                     strategies::megabytes_to_bytes(o.bucket_cap_mb));
    out << groups.size() << " buckets, each closed once it reaches " << o.bucket_cap_mb << " MiB (the first at "
        << first_mb << " MiB)";
  }
  out << ", in the order backward fills them\n";
  for (size_t g = 0; g < groups.size(); ++g) {
    int64_t n = 0, bytes = 0;
    for (const auto i : groups[g]) {
      n += params[i].numel();
      bytes += params[i].numel() * static_cast<int64_t>(params[i].element_size());
    }
    out << "  bucket " << g << ": " << groups[g].size() << " tensors, " << n << " params, " << mib(bytes);
    if (sharded) out << ", " << (n + ranks - 1) / ranks << " per rank";
    out << "\n";
  }
  return out.str();
}

constexpr int64_t kLargestListedModel = 1000000000;

std::string model_states_line(const train::Plan& plan, int64_t ranks, int64_t parameters) {
  const auto states = estimate::model_states(estimate::configured_layout(plan, ranks), parameters, plan.precision,
                                          plan.optimization.optimizer, !plan.device.is_cuda());
  std::ostringstream out;
  out << "model states per rank (ZeRO arithmetic): parameters " << mib(states.params) << ", gradients "
      << mib(states.grads) << ", optimizer " << mib(states.optimizer) << ", fp32 masters " << mib(states.masters)
      << ", communication buffers " << mib(states.buffers) << " = " << mib(states.total());
  return out.str();
}

}  // namespace

void check_plan_on_data(const train::Plan& plan) {
  const int64_t replicas =
      std::max<int64_t>(plan.strategy.drives_several_devices() ? plan.strategy_options.replicas : 1, 1);
  const train::Splits splits = train::check_before_training(plan, replicas);
  estimate::run_length(plan.length, plan.optimization.schedule, splits.train.size(),
                       std::max<int64_t>(plan.launch.world_size, 1), replicas);
}

std::string describe_layout(const train::Plan& plan) {
  const std::string strategy = plan.strategy.name();
  const int64_t ranks = std::max<int64_t>(plan.launch.world_size, 1);
  if (!plan.strategy.multi_process()) return "";
  // The model as the trainer builds it: its shape comes from the data (the test split stands for both).
  const auto test_split =
      data::open_dataset(plan.data, /*train=*/false, static_cast<int>(plan.data_options.loader_threads));
  const models::ModelSpec spec = train::model_spec(plan, test_split, test_split);
  std::ostringstream out;
  // A model too big to build in host memory just for this listing is counted, not built.
  const auto counted = models::parameters_without_building(spec);
  if (counted && *counted > kLargestListedModel) {
    out << "\n" << plan.model.name << " has " << *counted << " parameters: too many to build on the host for a listing "
        << "of its units (" << mib(*counted * 4) << " in fp32)\n";
    return out.str() + model_states_line(plan, ranks, *counted);
  }
  auto model = models::make_model(spec);
  // Buckets group by bytes, in the parameters' training dtype.
  if (plan.precision.param_dtype != torch::kFloat) models::to_floating_point(*model, c10::nullopt, plan.precision.param_dtype);
  const auto summary = models::summarize_model(*model);
  const int64_t parameters = summary.parameters;

  out << "\nmodel " << plan.model.name << ": " << models::describe_model_summary(summary) << "\n";
  if (plan.precision.fp8_matmuls)
    out << "fp8: " << models::describe_fp8_layers(model->set_fp8_linear(true, plan.model.fp8)) << "\n";
  out << "\nlayout of " << plan.model.name << " (" << parameters << " parameters) under " << strategy << " on " << ranks
      << " rank" << (ranks > 1 ? "s" : "") << ":\n";
  if (const auto* scripted = dynamic_cast<const models::TorchScriptModel*>(model.get())) {
    if (!scripted->units_note().empty()) out << scripted->units_note() << "\n";
    if (plan.model.activation_checkpointing && !scripted->checkpointing_note().empty())
      out << "activation checkpointing, " << scripted->checkpointing_note() << "\n";
  }
  if (plan.strategy.takes_fsdp_options()) {
    const auto options = strategies::fsdp_options(plan.strategy, plan.strategy_options);
    const bool hybrid = plan.strategy.hybrid();
    const int64_t local = std::max<int64_t>(plan.launch.local_world_size, 1);
    const int64_t shard_ranks = hybrid ? (options.hybrid_group_size > 0 ? options.hybrid_group_size : local) : ranks;
    out << strategies::describe_fsdp_units(*model, options, shard_ranks);
  } else if (plan.strategy.needs_units()) {
    std::vector<int> each(model->units().size());
    std::iota(each.begin(), each.end(), 0);
    out << strategy << ": every block a unit, sharded over " << ranks << " ranks\n"
        << strategies::describe_units(*model, each, ranks, true);
  } else {
    out << strategy << ": " << describe_buckets(*model, plan, ranks);
  }
  return out.str() + model_states_line(plan, ranks, parameters);
}

}  // namespace ptrain::cli
