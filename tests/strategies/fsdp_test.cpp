// FSDP parity: every sharding strategy, N ranks each on 1/N of a fixed global batch, must end where one
// process on the whole batch ends, with and without accumulation, with clipping, with prefetching and
// with parameter offload; the same runs check each rank's model-state bytes against the arithmetic of
// the ZeRO stage the strategy matches. The auto-wrap policies are checked on the zoo's ResNet-50.
#include "sharded_harness.h"
#include "ptrain/models/zoo.h"

#include <filesystem>

namespace ptrain::strategies {
namespace {

// UnitMlp's blocks fc1 (112 parameters) and fc2 (51) become units of their own; its unused layer (6)
// stays in the root.
FsdpOptions per_block(const std::string& sharding) {
  FsdpOptions o;
  o.sharding = StrategySpec::parse_fsdp_sharding(sharding);
  o.auto_wrap = AutoWrap::size;
  o.min_num_params = 50;
  return o;
}

ZeroSetup fsdp(const std::string& sharding, int accumulation = 1, double clip = 0) {
  ZeroSetup s;
  s.strategy = "fsdp";
  s.units = true;
  s.accumulation = accumulation;
  s.clip = clip;
  s.fsdp = per_block(sharding);
  return s;
}

TEST(Fsdp, FullShardParity) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  expect_zero_parity(fsdp("full-shard"), 2);
  expect_zero_parity(fsdp("full-shard", 2, 0.05), 3);
}

TEST(Fsdp, ShardGradOpParity) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  expect_zero_parity(fsdp("shard-grad-op"), 3);
  expect_zero_parity(fsdp("shard-grad-op", 2, 0.05), 2);
}

TEST(Fsdp, NoShardParity) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  expect_zero_parity(fsdp("no-shard"), 2);
  expect_zero_parity(fsdp("no-shard", 2, 0.05), 3);
}

// Four ranks in two shard groups of two, as on two nodes of two ranks (three rows each, so accumulation
// takes three micro-steps of one row); then two ranks in two groups of one (pure replication through the
// hybrid path).
TEST(Fsdp, HybridShardParity) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  for (const auto& [accumulation, clip] : std::vector<std::pair<int, double>>{{1, 0}, {3, 0}, {1, 0.05}}) {
    SCOPED_TRACE("accumulation " + std::to_string(accumulation) + ", clip " + std::to_string(clip));
    auto s = fsdp("hybrid-shard", accumulation, clip);
    s.local_world_size = 2;
    expect_zero_parity(s, 4);
  }
  auto s = fsdp("hybrid-shard-zero2");
  s.fsdp.hybrid_group_size = 1;
  expect_zero_parity(s, 2);
}

// What distinguishes the sharding strategies between forward and backward: full-shard frees a unit's
// gathered parameters after its forward, shard-grad-op keeps them until its backward is over; both hold
// nothing but shards once the step's backward is finished.
TEST(Fsdp, ShardGradOpKeepsGatheredParametersUntilBackward) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  const int port = testing::free_port();
  const auto outcomes = testing::run_world(
      2,
      [&](int rank) {
        for (const std::string sharding : {"full-shard", "shard-grad-op"}) {
          auto group = std::make_shared<distributed::ProcessGroup>(testing::loopback(rank, 2, port + (sharding == "full-shard" ? 0 : 1)),
                                                            "gloo", 20s);
          UnitMlp model;
          model.train();
          auto strategy = make_fsdp(group, torch::kCPU, per_block(sharding), 2);
          strategy->prepare(model);
          const auto held = [&] {
            return model.fc1->weight.storage().nbytes() > 0 && model.fc2->weight.storage().nbytes() > 0;
          };
          const auto out = strategy->forward(model, torch::randn({3, 6}));
          const bool after_forward = held();
          out.sum().backward();
          strategy->finish_backward();
          const bool after_backward = held();
          const bool expected = sharding == "shard-grad-op";
          if (after_forward != expected || after_backward)
            throw std::runtime_error(sharding + ": gathered after forward " + std::to_string(after_forward) +
                                     ", after backward " + std::to_string(after_backward));
        }
      },
      60);
  ranks_succeeded(outcomes);
}

TEST(Fsdp, PrefetchingChangesNothing) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  for (const std::string prefetch : {"pre", "post", "none"}) {
    auto s = fsdp("full-shard", 2, 0.05);
    s.fsdp.backward_prefetch = parse_backward_prefetch(prefetch);
    s.fsdp.forward_prefetch = prefetch == "post";
    expect_zero_parity(s, 3);
  }
}

TEST(Fsdp, ParityWithOffloadedParametersAndAdamW) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  auto s = fsdp("full-shard", 2, 0.05);
  s.offload_params = true;
  s.optimizer = "adamw";
  expect_zero_parity(s, 2);
}

// Without a policy that wraps anything, the whole model is the root unit.
TEST(Fsdp, WholeModelAsOneUnitParity) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  auto s = fsdp("full-shard");
  s.fsdp.auto_wrap = AutoWrap::none;
  expect_zero_parity(s, 3);
}

// The zoo's ResNet with activation checkpointing, blocks wrapped by type: FSDP must train it as DDP does.
TEST(Fsdp, ZooResNetWrappedByTypeMatchesDdp) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  ZeroSetup s;
  s.zoo_resnet = true;
  s.fsdp.auto_wrap = AutoWrap::type;
  s.fsdp.wrap_types = {"BasicBlock"};
  const int steps = 3;
  std::map<std::string, std::vector<torch::Tensor>> finals;
  for (const std::string strategy : {"ddp", "fsdp"}) {
    s.strategy = strategy;
    const int port = testing::free_port();
    const std::string dir = testing::temp_dir("fsdp-resnet");
    ASSERT_TRUE(ranks_succeeded(testing::run_world(2, [&](int rank) { train_rank(s, rank, 2, port, dir, 0, steps); }, 120)));
    std::vector<torch::Tensor> state;
    torch::load(state, rank_file(dir, "params", 0));
    finals[strategy] = state;
  }
  ASSERT_EQ(finals["fsdp"].size(), finals["ddp"].size());
  EXPECT_LE(worst_relative_difference(finals["fsdp"], finals["ddp"]), 1e-5);
  EXPECT_GT(worst_relative_difference(finals["ddp"], state_of(*make_zero_model(s, 100))), 1e-3);
}

// A checkpoint written by FSDP at world size 2, full (gathered on rank 0) or sharded (a file a rank),
// resumes under FSDP at 3 and under DDP at 2; sharded zero3 and AdamW's state resume likewise.
void expect_checkpoint_resumes(const ZeroSetup& s) {
  const std::string dir = testing::temp_dir("fsdp-ckpt");
  const std::string ckpt = dir + "/half.safetensors";
  {
    const int port = testing::free_port();
    ASSERT_TRUE(ranks_succeeded(
        testing::run_world(2, [&](int rank) { train_rank(s, rank, 2, port, dir, 0, kSteps / 2, "", ckpt); }, 90)));
  }
  const auto reference = train_zero_reference(s, kSteps);
  for (const auto& [strategy, world] : std::vector<std::pair<std::string, int>>{{s.strategy, 3}, {"ddp", 2}}) {
    auto resumed = s;
    resumed.strategy = strategy;
    const int port = testing::free_port();
    const std::string out = testing::temp_dir("fsdp-resumed");
    ASSERT_TRUE(ranks_succeeded(testing::run_world(
        world, [&](int rank) { train_rank(resumed, rank, world, port, out, kSteps / 2, kSteps, ckpt); }, 90)))
        << strategy;
    EXPECT_LE(worst_gap(out, world, reference), 1e-5) << strategy << " x " << world;
  }
}

TEST(Fsdp, FullCheckpointResumesAtAnotherWorldSizeAndUnderDdp) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  expect_checkpoint_resumes(fsdp("full-shard"));
}

TEST(Fsdp, ShardedCheckpointResumesAtAnotherWorldSizeAndUnderDdp) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  auto s = fsdp("full-shard");
  s.sharded_checkpoint = true;
  expect_checkpoint_resumes(s);
  s.strategy = "zero3";
  s.optimizer = "adamw";
  expect_checkpoint_resumes(s);
  // A missing shard file is named.
  const std::string dir = testing::temp_dir("fsdp-ckpt-broken");
  const std::string ckpt = dir + "/half.safetensors";
  const int port = testing::free_port();
  ASSERT_TRUE(ranks_succeeded(
      testing::run_world(2, [&](int rank) { train_rank(s, rank, 2, port, dir, 0, 2, "", ckpt); }, 90)));
  std::filesystem::remove(train::shard_path(ckpt, 1));
  try {
    train::load_checkpoint(ckpt);
    ADD_FAILURE() << "a checkpoint without one of its shards loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("half.rank-00001.safetensors is missing"), std::string::npos) << e.what();
  }
}

std::shared_ptr<models::Model> resnet50() { return models::make_model({"resnet50", 10, 3, 224}); }

// PyTorch's size-based policy on ResNet-50 with min_num_params 1e6: layer3's and layer4's bottlenecks
// (1.1M-4.5M parameters) are units alone; layer1's (75k-71k) stay unwrapped, as layer1 holds 216k
// together; layer2's four (280k-379k) hold 1.2M together, so layer2 is one unit.
TEST(FsdpAutoWrap, SizeBasedFollowsPyTorchsPolicyOnResNet50) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  auto model = resnet50();
  FsdpOptions o;
  o.min_num_params = 1000000;
  const auto wrap = fsdp_auto_wrap(*model, o);
  const auto units = model->units();
  ASSERT_EQ(wrap.size(), units.size());
  std::map<std::string, int> unit_of;
  for (size_t u = 0; u < units.size(); ++u) unit_of[units[u].first] = wrap[u];
  EXPECT_EQ(unit_of["stem"], -1);
  EXPECT_EQ(unit_of["layer1.0"], -1);
  EXPECT_EQ(unit_of["fc"], -1);
  EXPECT_GE(unit_of["layer2.0"], 0);
  for (const char* name : {"layer2.1", "layer2.2", "layer2.3"}) EXPECT_EQ(unit_of[name], unit_of["layer2.0"]) << name;
  std::set<int> distinct;
  for (const char* name : {"layer3.0", "layer3.1", "layer3.5", "layer4.0", "layer4.2"}) {
    EXPECT_GE(unit_of[name], 0) << name;
    distinct.insert(unit_of[name]);
  }
  EXPECT_EQ(distinct.size(), 5u) << "each big bottleneck is a unit of its own";
  EXPECT_EQ(std::set<int>(wrap.begin(), wrap.end()).size(), 1u + 1u + 6u + 3u);  // root, layer2, layer3, layer4

  o.min_num_params = 100000000;  // PyTorch's default: nothing is big enough, the root holds it all
  const auto none = fsdp_auto_wrap(*model, o);
  EXPECT_EQ(std::set<int>(none.begin(), none.end()), std::set<int>{-1});

  FsdpOptions sized;
  sized.min_num_params = 1000000;
  const std::string plan = describe_fsdp_units(*model, sized, 2);
  EXPECT_NE(plan.find("layer4.0    Bottleneck"), std::string::npos) << plan;
  EXPECT_NE(plan.find("per rank"), std::string::npos) << plan;
}

TEST(FsdpAutoWrap, TypeBasedWrapsTheNamedBlocksAndNamesWhatExists) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  auto model = resnet50();
  FsdpOptions o;
  o.auto_wrap = AutoWrap::type;
  o.wrap_types = {"Bottleneck"};
  const auto wrap = fsdp_auto_wrap(*model, o);
  EXPECT_EQ(wrap.front(), -1);  // stem
  EXPECT_EQ(wrap.back(), -1);   // fc
  EXPECT_EQ(std::set<int>(wrap.begin() + 1, wrap.end() - 1).size(), 16u);  // 3 + 4 + 6 + 3 bottlenecks

  o.wrap_types = {"TransformerBlock"};
  try {
    fsdp_auto_wrap(*model, o);
    ADD_FAILURE() << "an unknown block type was accepted";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("TransformerBlock"), std::string::npos) << message;
    EXPECT_NE(message.find("Bottleneck"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace ptrain::strategies
