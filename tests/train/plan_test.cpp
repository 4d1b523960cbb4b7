#include "ptrain/train/plan.h"

#include <gtest/gtest.h>

#include "ptrain/core/error.h"
#include "test_support.h"

namespace {

ptrain::config::TrainConfig cpu_config() {
  ptrain::config::TrainConfig c;
  c.run.device = "cpu";
  return c;
}

std::string plan_error(const ptrain::config::TrainConfig& c) {
  return ptrain::testing::error_message<ptrain::Error>([&] { ptrain::train::make_plan(c); });
}

TEST(Plan, LossScalerRulesNeedADynamicScale) {
  auto c = cpu_config();
  c.precision.hysteresis = 2;  // fp32 has no loss scaling
  const std::string message = plan_error(c);
  EXPECT_NE(message.find("--hysteresis"), std::string::npos) << message;
  EXPECT_NE(message.find("fp32"), std::string::npos) << message;

  const auto plain = ptrain::train::make_plan(cpu_config());  // the defaults are GradScaler's and pass
  EXPECT_EQ(plain.precision.hysteresis, 1);
  EXPECT_EQ(plain.precision.loss_scale_window, 2000);
}

// --skip-fusions names fusions the run would take: of ptrain's own models, with the fused kernels on, the weight
// casts under autocast, the batch norms' on CUDA; else it is refused by name, as a flag without effect is.
TEST(Plan, SkippedFusionsAreOnesTheRunWouldTake) {
  auto c = cpu_config();
  c.model.name = "resnet20";
  c.precision.precision = "amp-bf16";
  c.run.skip_fusions = {"weight-casts", "stem_pool"};
  std::string message = plan_error(c);
  EXPECT_NE(message.find("--skip-fusions: 'stem_pool' is not a fusion (did you mean stem-pool?)"), std::string::npos)
      << message;
  EXPECT_NE(message.find("residual-twins"), std::string::npos) << message;
  c.run.skip_fusions = {"weight-casts"};
  EXPECT_NO_THROW(ptrain::train::make_plan(c));
  c.run.skip_fusions = {"weight-casts", "weight-casts"};
  EXPECT_NE(plan_error(c).find("--skip-fusions: 'weight-casts' is named twice"), std::string::npos) << plan_error(c);
  c.run.skip_fusions = {"weight-casts", "shortcut-norms"};
  message = plan_error(c);
  EXPECT_NE(message.find("--skip-fusions shortcut-norms: the batch norms' fused kernels run on CUDA only"),
            std::string::npos)
      << message;
  c.run.skip_fusions = {"weight-casts"};
  c.run.fused_kernels = false;
  EXPECT_NE(plan_error(c).find("--no-fused-kernels already leaves every fusion out"), std::string::npos);
  c.run.fused_kernels = true;
  c.precision.precision = "fp32";
  EXPECT_NE(plan_error(c).find("--skip-fusions weight-casts: --precision fp32 casts no weight"), std::string::npos)
      << plan_error(c);
  c.model.name = "gpt-tiny";
  c.data.dataset = "synthetic-tokens";
  c.precision.precision = "amp-bf16";
  c.run.skip_fusions = {"residual-twins"};
  EXPECT_NE(plan_error(c).find("--model gpt-tiny has no batch norms"), std::string::npos) << plan_error(c);
  c.run.skip_fusions = {"bias-gradients"};
  EXPECT_NE(plan_error(c).find("--skip-fusions bias-gradients: the fused bias gradients run on CUDA only"),
            std::string::npos)
      << plan_error(c);
  c.run.skip_fusions = {"fp8-amax"};
  EXPECT_NE(plan_error(c).find("--skip-fusions fp8-amax: --precision amp-bf16 casts nothing to FP8"),
            std::string::npos)
      << plan_error(c);
  c.model.name = "resnet20";
  c.data.dataset = cpu_config().data.dataset;
  EXPECT_NE(plan_error(c).find("only GPT's blocks take the FP8 casts' amax from their kernels, not --model resnet20's"),
            std::string::npos)
      << plan_error(c);
  c.run.skip_fusions = {"bias-gradients"};
  EXPECT_NE(plan_error(c).find("only GPT's blocks take the fused bias gradients, not --model resnet20's"),
            std::string::npos)
      << plan_error(c);
}

TEST(Plan, WarmupInStepsAndInEpochsExcludeEachOther) {
  auto c = cpu_config();
  c.optim.warmup_steps = 10;
  c.optim.warmup_epochs = 1;
  EXPECT_NE(plan_error(c).find("--warmup-steps"), std::string::npos);
}

// The strategy's flags reach the strategy typed, parsed once here; a config file's names are checked as the
// command line's are.
TEST(Plan, StrategyOptionsAreParsedAndCheckedOnce) {
  auto c = cpu_config();
  c.run.strategy = "fsdp";
  c.sharding.fsdp_sharding = "hybrid-shard";
  c.sharding.auto_wrap = "type";
  c.sharding.wrap_types = {"Bottleneck"};
  c.sharding.backward_prefetch = "post";
  c.sharding.state_dict = "sharded";
  c.sharding.hybrid_group_size = 2;
  c.sharding.forward_prefetch = true;
  const auto plan = ptrain::train::make_plan(c);
  EXPECT_EQ(plan.strategy, ptrain::strategies::StrategySpec::parse("fsdp", "hybrid-shard"));
  const auto& o = plan.strategy_options;
  EXPECT_EQ(o.auto_wrap, ptrain::strategies::AutoWrap::type);
  EXPECT_EQ(o.wrap_types, std::vector<std::string>{"Bottleneck"});
  EXPECT_EQ(o.backward_prefetch, ptrain::strategies::Prefetch::backward_post);
  EXPECT_EQ(o.state_dict, ptrain::strategies::StateDict::sharded);
  EXPECT_EQ(o.hybrid_group_size, 2);
  EXPECT_TRUE(o.forward_prefetch);

  auto bad = c;
  bad.sharding.auto_wrap = "layer";
  EXPECT_EQ(plan_error(bad), "--auto-wrap: unknown policy 'layer' (known: size, type, none)");
  bad = c;
  bad.sharding.backward_prefetch = "early";
  EXPECT_NE(plan_error(bad).find("--backward-prefetch: unknown 'early'"), std::string::npos) << plan_error(bad);
  bad = c;
  bad.sharding.wrap_types.clear();
  EXPECT_NE(plan_error(bad).find("--auto-wrap type needs --wrap-types"), std::string::npos) << plan_error(bad);
  bad = c;
  bad.sharding.fsdp_sharding = "full-shard";
  EXPECT_NE(plan_error(bad).find("--hybrid-group-size applies to --fsdp-sharding hybrid-shard only"), std::string::npos)
      << plan_error(bad);
  bad = c;
  bad.sharding.state_dict = "local";
  EXPECT_NE(plan_error(bad).find("--state-dict: unknown 'local'"), std::string::npos) << plan_error(bad);
}

TEST(Plan, FsdpSettingsAreRefusedUnderOtherStrategies) {
  auto c = cpu_config();
  c.run.strategy = "ddp";
  c.sharding.auto_wrap = "type";
  EXPECT_NE(plan_error(c).find("--auto-wrap applies to --strategy fsdp only"), std::string::npos) << plan_error(c);
  c = cpu_config();
  c.run.strategy = "zero3";
  c.sharding.param_dtype = "bf16";
  EXPECT_NE(plan_error(c).find("--param-dtype"), std::string::npos) << plan_error(c);
  c = cpu_config();
  c.run.strategy = "fsdp";
  c.sharding.offload_optimizer = true;
  EXPECT_NE(plan_error(c).find("--offload-params moves the optimizer step"), std::string::npos) << plan_error(c);
}

TEST(Plan, FsdpParamDtypeTurnsFp32IntoHalfComputeOnFp32Masters) {
  auto c = cpu_config();
  c.run.strategy = "fsdp";
  c.sharding.param_dtype = "bf16";
  auto plan = ptrain::train::make_plan(c);
  EXPECT_EQ(plan.precision.param_dtype, torch::kBFloat16);
  EXPECT_EQ(plan.precision.compute_dtype, torch::kBFloat16);
  EXPECT_TRUE(plan.precision.master_weights);
  EXPECT_FALSE(plan.precision.autocast);

  c.precision.precision = "amp-bf16";  // accelerate's FSDP with mixed_precision bf16
  c.sharding.buffer_dtype = "bf16";
  plan = ptrain::train::make_plan(c);
  EXPECT_EQ(plan.precision.param_dtype, torch::kBFloat16);
  EXPECT_TRUE(plan.precision.autocast);
  EXPECT_TRUE(plan.precision.master_weights);

  c.sharding.buffer_dtype = "fp32";
  EXPECT_NE(plan_error(c).find("--buffer-dtype fp32"), std::string::npos) << plan_error(c);
}

TEST(Plan, NormalizeDefaultsToTheDatasetsValuesAndTakesOneOrPerChannelValues) {
  auto c = cpu_config();
  c.data.dataset = "cifar10";
  auto plan = ptrain::train::make_plan(c);
  EXPECT_EQ(plan.normalization.mean, (std::vector<float>{0.4914f, 0.4822f, 0.4465f}));
  EXPECT_EQ(plan.normalization.std, (std::vector<float>{0.2470f, 0.2435f, 0.2616f}));
  EXPECT_NE(ptrain::train::describe(plan).find("normalised mean 0.4914,0.4822,0.4465 std 0.247,0.2435,0.2616"),
            std::string::npos) << ptrain::train::describe(plan);

  c.data.normalize = "0.5,0.25";
  plan = ptrain::train::make_plan(c);
  EXPECT_EQ(plan.normalization.mean, std::vector<float>{0.5f});
  EXPECT_EQ(plan.normalization.std, std::vector<float>{0.25f});

  c.data.normalize = "0.485,0.456,0.406/0.229,0.224,0.225";
  plan = ptrain::train::make_plan(c);
  EXPECT_EQ(plan.normalization.mean, (std::vector<float>{0.485f, 0.456f, 0.406f}));
  EXPECT_EQ(plan.normalization.std, (std::vector<float>{0.229f, 0.224f, 0.225f}));

  c.data.normalize = "none";
  plan = ptrain::train::make_plan(c);
  EXPECT_EQ(plan.normalization.mean, std::vector<float>{0.0f});
  EXPECT_EQ(plan.normalization.std, std::vector<float>{1.0f});
}

TEST(Plan, BadNormalizeValuesAreRefusedNamingTheFlag) {
  for (const std::string bad : {"abc", "0.5", "0.5,0", "0.5,-1", "nan,1", "0.5,0.5,0.5", "0.1,0.2/0.3", "0.1,/0.2,0.3",
                                "0.5,0.5x", "1/0"}) {
    auto c = cpu_config();
    c.data.normalize = bad;
    const std::string message = plan_error(c);
    EXPECT_EQ(message.rfind("--normalize '" + bad + "'", 0), 0u) << bad << ": " << message;
  }
  auto c = cpu_config();
  c.model.name = "gpt-tiny";
  c.data.dataset = "synthetic-tokens";
  c.data.normalize = "0.5,0.5";
  EXPECT_NE(plan_error(c).find("--normalize applies to image datasets"), std::string::npos) << plan_error(c);
}

// Every output of a run is checked in make_plan, before any work (train, --dry-run, estimate's plan): two
// outputs on one file, a file among the checkpoints, and an output that cannot be written, its flag named.
TEST(Plan, OutputsThatCollideOrCannotBeWrittenAreRefusedBeforeAnyWork) {
  ptrain::testing::TempDir dir;
  auto c = cpu_config();
  c.model.save_weights = dir.file("x.pt");
  c.run.metrics_out = dir.file("x.pt");
  EXPECT_EQ(plan_error(c), "--save-weights " + dir.file("x.pt") + " and --metrics-out " + dir.file("x.pt") +
                               " are one file: the second written would replace the first");
  c.run.metrics_out = "";
  c.run.checkpoint_dir = dir.file("ck");
  c.model.save_weights = dir.file("ck/step-00000008.pt");
  EXPECT_NE(plan_error(c).find("--save-weights " + dir.file("ck/step-00000008.pt") + " lies inside --checkpoint-dir " +
                               dir.file("ck")),
            std::string::npos)
      << plan_error(c);
  c.model.save_weights = "";
  c.run.checkpoint_dir = "";
  c.run.log_jsonl = dir.file("run.json");
  c.run.metrics_out = dir.file("run.json");
  EXPECT_NE(plan_error(c).find("--metrics-out " + dir.file("run.json") + " and --log-jsonl " + dir.file("run.json") +
                               " are one file"),
            std::string::npos)
      << plan_error(c);
  c.run.log_jsonl = "";
  c.run.metrics_out = "";
  // --profile-out was found out only once the traced steps were done.
  ptrain::testing::write_bytes(dir.file("plain"), "a file");
  c.run.profile_out = dir.file("plain/trace.json");
  EXPECT_EQ(plan_error(c), "--profile-out " + dir.file("plain/trace.json") + ": cannot be created, " +
                               dir.file("plain") + " is a file, not a directory");
  c.run.profile_out = "/dev/null";
  EXPECT_NE(plan_error(c).find("--profile-out /dev/null: must be a regular file"), std::string::npos) << plan_error(c);
  c.run.profile_out = dir.file("trace.json");
  EXPECT_NO_THROW(ptrain::train::make_plan(c));
}

// A pause without a checkpoint kept nothing and exited 0.
TEST(Plan, StopAtStepNeedsACheckpointDirectory) {
  auto c = cpu_config();
  c.run.stop_at_step = 4;
  EXPECT_NE(plan_error(c).find("--stop-at-step needs --checkpoint-dir"), std::string::npos) << plan_error(c);
}

// The run reads the plan's sections, the record and the ranks' agreement its settings: both hold the config as
// make_plan resolved it (here --global-batch-size over --grad-accum, and the threads), not as it was given.
TEST(Plan, SectionsAndSettingsHoldTheResolvedConfig) {
  auto c = cpu_config();
  c.run.global_batch_size = 64;
  c.optim.grad_accum = 4;
  c.optim.name = "adamw";
  c.run.threads = 2;
  const auto plan = ptrain::train::make_plan(c);
  const auto resolved = ptrain::train::resolve_config(c);
  EXPECT_EQ(resolved.run.batch_size, 16);
  EXPECT_EQ(plan.length.batch_size, 16);
  EXPECT_EQ(plan.length.grad_accum, 4);
  EXPECT_EQ(plan.device_setup.threads, 2);
  EXPECT_EQ(plan.optimization.optimizer.kind, ptrain::train::OptimizerKind::adamw);
  EXPECT_EQ(plan.optimization.optimizer.slots(), 2);
  EXPECT_EQ(plan.settings, ptrain::config::to_json(resolved));
}

// An optimizer the run cannot build is refused with the rest of the plan, so that --dry-run and estimate refuse it too.
TEST(Plan, AnUnknownOptimizerIsRefusedByName) {
  auto c = cpu_config();
  c.optim.name = "adam";
  EXPECT_NE(plan_error(c).find("--optimizer: unknown optimizer 'adam' (known: sgd, adamw)"), std::string::npos)
      << plan_error(c);
}

}  // namespace
