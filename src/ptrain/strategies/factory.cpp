#include <chrono>

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

std::unique_ptr<Strategy> make_strategy(const config::TrainConfig& config, torch::Device device,
                                        const dist::LaunchEnvironment& launch) {
  const std::string& name = config.run.strategy;
  if (name == "single") return std::make_unique<SingleDevice>(device);
  if (name == "dp") {
    check(config.dist.replicas > 0, "--strategy dp: --replicas is unresolved (the plan sets it)");
    std::vector<torch::Device> devices;
    for (int64_t i = 0; i < config.dist.replicas; ++i)
      devices.push_back(device.is_cuda() ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(device.index() + i))
                                         : torch::Device(torch::kCPU));
    return std::make_unique<DataParallel>(std::move(devices));
  }
  const auto make_group = [&] {
    const std::string backend = !config.dist.backend.empty() ? config.dist.backend : device.is_cuda() ? "nccl" : "gloo";
    return std::make_shared<dist::ProcessGroup>(
        launch, backend, std::chrono::milliseconds(static_cast<int64_t>(config.dist.timeout_seconds * 1000)));
  };
  if (name == "ddp") {
    auto group = make_group();
    DdpOptions options;
    options.bucket_cap_mb = config.dist.bucket_cap_mb;
    options.sync_batchnorm = config.dist.sync_batchnorm;
    if (!config.sharding.reduce_dtype.empty()) options.reduce_dtype = precision::dtype_named(config.sharding.reduce_dtype);
    options.overlap = config.sharding.overlap_comm;
    return std::make_unique<DistributedDataParallel>(std::move(group), device, options);
  }
  if (name == "zero1" || name == "zero2" || name == "zero3") {
    ZeroOptions options;
    options.stage = name.back() - '0';
    options.offload_optimizer = config.sharding.offload_optimizer;
    options.offload_params = config.sharding.offload_params;
    options.reduce_bucket_mb = config.sharding.reduce_bucket_mb;
    options.overlap_comm = config.sharding.overlap_comm;
    return std::make_unique<Zero>(make_group(), device, options);
  }
  if (name == "fsdp") return make_fsdp(make_group(), device, fsdp_options(config.sharding), launch.local_world_size);
  throw Error("--strategy: unknown strategy '" + name + "' (known: single, dp, ddp, zero1, zero2, zero3, fsdp)");
}

}  // namespace ptrain::strategies
