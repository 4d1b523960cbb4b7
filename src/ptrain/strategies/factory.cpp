#include <chrono>
#include <optional>

#include "ptrain/core/error.h"
#include "ptrain/distributed/process_group.h"
#include "ptrain/precision/policy.h"
#include "ptrain/strategies/data_parallel.h"
#include "ptrain/strategies/ddp.h"
#include "ptrain/strategies/fsdp.h"
#include "ptrain/strategies/single_device.h"
#include "ptrain/strategies/strategy.h"
#include "ptrain/strategies/zero.h"

namespace ptrain::strategies {

std::unique_ptr<Strategy> make_strategy(const StrategySpec& spec, const StrategyOptions& options,
                                        const precision::PrecisionPolicy& precision, torch::Device device,
                                        const distributed::LaunchEnvironment& launch) {
  const auto make_group = [&] {
    const std::string backend = !options.backend.empty() ? options.backend : device.is_cuda() ? "nccl" : "gloo";
    return std::make_shared<distributed::ProcessGroup>(
        launch, backend, std::chrono::milliseconds(static_cast<int64_t>(options.timeout_seconds * 1000)));
  };
  // Gradients travel in the policy's reduce dtype; unset where that is the parameters' own.
  const std::optional<torch::ScalarType> reduce_dtype =
      precision.reduce_dtype != precision.param_dtype ? std::optional<torch::ScalarType>(precision.reduce_dtype)
                                                      : std::nullopt;
  switch (spec.kind()) {
    case StrategyKind::single:
      return std::make_unique<SingleDevice>(device);
    case StrategyKind::dp: {
      check(options.replicas > 0, "--strategy dp: --replicas is unresolved (the plan sets it)");
      std::vector<torch::Device> devices;
      for (int64_t i = 0; i < options.replicas; ++i)
        devices.push_back(device.is_cuda() ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(device.index() + i))
                                           : torch::Device(torch::kCPU));
      return std::make_unique<DataParallel>(std::move(devices));
    }
    case StrategyKind::ddp: {
      auto group = make_group();
      DdpOptions ddp;
      ddp.bucket_cap_mb = options.bucket_cap_mb;
      ddp.sync_batchnorm = options.sync_batchnorm;
      ddp.reduce_dtype = reduce_dtype;
      ddp.overlap = options.overlap_comm;
      return std::make_unique<DistributedDataParallel>(std::move(group), device, ddp);
    }
    case StrategyKind::zero1:
    case StrategyKind::zero2:
    case StrategyKind::zero3: {
      ZeroOptions zero;
      zero.offload_optimizer = options.offload_optimizer;
      zero.offload_params = options.offload_params;
      zero.reduce_bucket_mb = options.reduce_bucket_mb;
      zero.overlap_comm = options.overlap_comm;
      // zero3 gathers the next unit while the current one computes, forward and backward, as DeepSpeed's
      // stage 3 prefetches (stage3_prefetch_bucket_size): the all-gather then hides behind compute instead of
      // standing between units. FSDP's own flags (--backward-prefetch, --forward-prefetch) stay FSDP's.
      zero.backward_prefetch = Prefetch::backward_pre;
      zero.forward_prefetch = true;
      return std::make_unique<Zero>(make_group(), device, spec, zero);
    }
    case StrategyKind::fsdp: {
      auto fsdp = fsdp_options(spec, options);
      fsdp.reduce_dtype = reduce_dtype;
      return make_fsdp(make_group(), device, fsdp, launch.local_world_size);
    }
  }
  throw Error("--strategy: no factory case for '" + spec.name() + "'");
}

}  // namespace ptrain::strategies
