// Gradient memory lives only as long as a step needs it, as a single device's gradients do: the reducer gives
// back what a launched reduction read (a transient flat buffer, the gradients copied into it) one slot later
// where waiting orders streams, and the flat parameter groups hold no gradient buffer between steps.
#include <gtest/gtest.h>

#include <optional>

#include "sharded_harness.h"

namespace ptrain::strategies {
namespace {

// Lanes that are no-ops, as the CPU's, but that say waiting orders streams: the reducer then takes back held
// memory as it does under NCCL (its waits block the host here).
class StreamOrderedForTest final : public distributed::CommStreams {
 public:
  std::shared_ptr<void> after_compute(distributed::CommLane) override { return nullptr; }
  std::shared_ptr<void> on(distributed::CommLane) override { return nullptr; }
  void compute_waits(distributed::CommLane) override {}
  bool orders_streams() const override { return true; }
};

using WeakStorage = c10::weak_intrusive_ptr<c10::StorageImpl>;

struct HeldMemory {
  bool first_held_after_second_launched = false;  // slot 0's held tensor alive once slot 1 launched
  bool first_held_after_finish = true;            // ... once finish() returned
  std::vector<float> sums;                        // the slots' outputs
};

HeldMemory reduce_two_slots(std::shared_ptr<distributed::CommStreams> streams, int port) {
  auto group = std::make_shared<distributed::ProcessGroup>(testing::loopback(0, 1, port), "gloo", 20s);
  GradientReducer reducer({std::nullopt, true}, std::move(streams));
  std::vector<std::optional<WeakStorage>> held(2);  // weak pointers have no empty state
  std::vector<torch::Tensor> outputs(2);
  for (size_t k = 0; k < 2; ++k) {
    ReductionSlot slot;
    slot.all = group;
    slot.buffers = [&outputs, k] {
      outputs[k] = torch::empty({4});
      return ReductionBuffers{outputs[k], outputs[k]};
    };
    slot.fill = [&held, k](const torch::Tensor& input, std::vector<torch::Tensor>* hold) {
      auto copied_from = torch::full({4}, static_cast<float>(k + 1));
      input.copy_(copied_from);
      held[k].emplace(copied_from.storage().getWeakStorageImpl());
      hold->push_back(copied_from);
    };
    reducer.add_slot(std::move(slot));
  }
  HeldMemory result;
  reducer.mark_ready(0);
  reducer.mark_ready(1);
  result.first_held_after_second_launched = !held[0]->expired();
  reducer.finish();
  result.first_held_after_finish = !held[0]->expired() || !held[1]->expired();
  for (const auto& out : outputs) result.sums.push_back(out.sum().item<float>());
  return result;
}

TEST(GradientReducer, GivesBackWhatAReductionHeldOneSlotLaterWhereWaitsOrderStreams) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  const auto ordered = reduce_two_slots(std::make_shared<StreamOrderedForTest>(), testing::free_port());
  EXPECT_FALSE(ordered.first_held_after_second_launched) << "slot 0's memory was held past slot 1's launch";
  EXPECT_FALSE(ordered.first_held_after_finish);
  EXPECT_EQ(ordered.sums, (std::vector<float>{4, 8}));
  // Where the host waits (gloo's lanes), nothing is waited on before finish(): the memory stays held till then.
  const auto host = reduce_two_slots(distributed::make_comm_streams(torch::kCPU), testing::free_port());
  EXPECT_TRUE(host.first_held_after_second_launched);
  EXPECT_FALSE(host.first_held_after_finish);
  EXPECT_EQ(host.sums, (std::vector<float>{4, 8}));
}

// One rank, the trainer's order of calls: forward, backward, finish_backward, gradients_ready, (the optimizer's
// step), parameters_updated, zero_grad. Between steps no group holds gradient memory and the model's parameters
// hold no gradients; two steps on the same batch without an update give the same gradients (nothing of the
// first leaks into the second).
struct StepMemory {
  size_t groups = 0;
  size_t holding_after_reduction = 0;  // groups holding gradient memory after finish_backward
  size_t holding_after_step = 0;       // ... after parameters_updated
  bool model_grads_cleared = false;
  std::vector<torch::Tensor> first, second;  // the update target's gradients after each step
};

StepMemory two_steps(const std::string& strategy, int port) {
  auto group = std::make_shared<distributed::ProcessGroup>(testing::loopback(0, 1, port), "gloo", 20s);
  torch::manual_seed(7);
  auto model = std::make_shared<UnitMlp>();
  ZeroOptions options;
  options.reduce_bucket_mb = 100.0 / (1 << 20);  // several groups
  Zero zero(group, torch::kCPU, StrategySpec::parse(strategy), options);
  zero.prepare(*model);
  auto target = zero.update_target(*model, false);
  const auto batch = global_batch(0, false);
  StepMemory memory;
  memory.groups = zero.group_count();
  for (auto* grads : {&memory.first, &memory.second}) {
    torch::mse_loss(zero.forward(*model, batch.x), batch.y).backward();
    zero.finish_backward();
    target->gradients_ready();
    for (const auto& p : target->params()) grads->push_back(p.grad().clone());
    if (grads == &memory.first) memory.holding_after_reduction = zero.groups_holding_gradients();
    target->parameters_updated();
    for (auto p : target->params()) p.mutable_grad().reset();  // the optimizer's zero_grad
    if (grads == &memory.first) {
      memory.holding_after_step = zero.groups_holding_gradients();
      memory.model_grads_cleared = true;
      for (const auto& p : model->parameters()) memory.model_grads_cleared = memory.model_grads_cleared && !p.grad().defined();
    }
  }
  return memory;
}

TEST(ZeroGradientMemory, GroupsHoldNoGradientsBetweenSteps) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  for (const std::string strategy : {"zero1", "zero2", "zero3"}) {
    const auto memory = two_steps(strategy, testing::free_port());
    EXPECT_EQ(memory.holding_after_reduction, memory.groups) << strategy;
    EXPECT_EQ(memory.holding_after_step, 0u) << strategy << ": a gradient buffer outlived its step";
    EXPECT_TRUE(memory.model_grads_cleared) << strategy << ": the model's parameters kept gradients";
    ASSERT_EQ(memory.first.size(), memory.second.size()) << strategy;
    float total = 0;
    for (size_t i = 0; i < memory.first.size(); ++i) {
      EXPECT_TRUE(torch::equal(memory.first[i], memory.second[i])) << strategy << ", group " << i;
      total += memory.first[i].abs().sum().item<float>();
    }
    EXPECT_GT(total, 0.0f) << strategy << ": no gradient at all";
  }
}

}  // namespace
}  // namespace ptrain::strategies
