#include <chrono>
#include <optional>

#include "ptrain/core/error.h"
#include "ptrain/dist/process_group.h"
#include "ptrain/precision/policy.h"
#include "ptrain/strategies/data_parallel.h"
#include "ptrain/strategies/ddp.h"
#include "ptrain/strategies/fsdp.h"
#include "ptrain/strategies/single_device.h"
#include "ptrain/strategies/strategy.h"
#include "ptrain/strategies/zero.h"

namespace ptrain::strategies {

std::unique_ptr<Strategy> make_strategy(const StrategySpec& spec, const config::TrainConfig& config,
                                        const precision::PrecisionPolicy& precision, torch::Device device,
                                        const dist::LaunchEnvironment& launch) {
  const auto make_group = [&] {
    const std::string backend = !config.dist.backend.empty() ? config.dist.backend : device.is_cuda() ? "nccl" : "gloo";
    return std::make_shared<dist::ProcessGroup>(
        launch, backend, std::chrono::milliseconds(static_cast<int64_t>(config.dist.timeout_seconds * 1000)));
  };
  // Gradients travel in the policy's reduce dtype; unset where that is the parameters' own.
  const std::optional<torch::ScalarType> reduce_dtype =
      precision.reduce_dtype != precision.param_dtype ? std::optional<torch::ScalarType>(precision.reduce_dtype)
                                                      : std::nullopt;
  switch (spec.kind()) {
    case StrategyKind::single:
      return std::make_unique<SingleDevice>(device);
    case StrategyKind::dp: {
      check(config.dist.replicas > 0, "--strategy dp: --replicas is unresolved (the plan sets it)");
      std::vector<torch::Device> devices;
      for (int64_t i = 0; i < config.dist.replicas; ++i)
        devices.push_back(device.is_cuda() ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(device.index() + i))
                                           : torch::Device(torch::kCPU));
      return std::make_unique<DataParallel>(std::move(devices));
    }
    case StrategyKind::ddp: {
      auto group = make_group();
      DdpOptions options;
      options.bucket_cap_mb = config.dist.bucket_cap_mb;
      options.sync_batchnorm = config.dist.sync_batchnorm;
      options.reduce_dtype = reduce_dtype;
      options.overlap = config.sharding.overlap_comm;
      return std::make_unique<DistributedDataParallel>(std::move(group), device, options);
    }
    case StrategyKind::zero1:
    case StrategyKind::zero2:
    case StrategyKind::zero3: {
      ZeroOptions options;
      options.stage = spec.zero_stage();
      options.offload_optimizer = config.sharding.offload_optimizer;
      options.offload_params = config.sharding.offload_params;
      options.reduce_bucket_mb = config.sharding.reduce_bucket_mb;
      options.overlap_comm = config.sharding.overlap_comm;
      return std::make_unique<Zero>(make_group(), device, options);
    }
    case StrategyKind::fsdp: {
      auto options = fsdp_options(config.sharding);
      options.reduce_dtype = reduce_dtype;
      return make_fsdp(make_group(), device, options, launch.local_world_size);
    }
  }
  throw Error("--strategy: no factory case for '" + spec.name() + "'");
}

std::unique_ptr<Strategy> make_strategy(const config::TrainConfig& config, torch::Device device,
                                        const dist::LaunchEnvironment& launch) {
  const auto spec = StrategySpec::parse(config.run.strategy, config.sharding.fsdp_sharding);
  auto policy = precision::resolve_precision(config.precision.precision, config.precision.master_weights,
                                             device.type(), config.precision.loss_scale);
  if (!config.sharding.reduce_dtype.empty()) policy.reduce_dtype = precision::dtype_named(config.sharding.reduce_dtype);
  else policy.reduce_dtype = policy.param_dtype;
  return make_strategy(spec, config, policy, device, launch);
}

}  // namespace ptrain::strategies
