#include "ptrain/config/deepspeed_config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "ptrain/config/cli_options.h"
#include "ptrain/core/error.h"
#include "test_support.h"

namespace {

using ptrain::config::BatchKey;
using ptrain::config::BatchSizes;
using ptrain::config::resolve_batch_sizes;
using ptrain::config::TrainConfig;

struct Applied {
  TrainConfig config;
  std::vector<std::string> warnings;
};

// Parses argv as `ptrain train` does, then applies the ds_config.json text (written to a file).
Applied apply(const std::string& json_text, std::vector<std::string> args = {}, int64_t world_size = 1) {
  ptrain::testing::TempDir dir;
  const std::string path = dir.file("ds_config.json");
  std::ofstream(path) << json_text;
  Applied out;
  CLI::App app;
  ptrain::config::add_train_options(app, out.config);
  std::vector<const char*> argv{"train"};
  for (const auto& a : args) argv.push_back(a.c_str());
  app.parse(static_cast<int>(argv.size()), const_cast<char**>(argv.data()));
  out.warnings = ptrain::config::apply_deepspeed_config(app, out.config, path, world_size);
  return out;
}

std::string error_of(const std::string& json_text, std::vector<std::string> args = {}, int64_t world_size = 1) {
  return ptrain::testing::error_message<ptrain::Error>([&] { apply(json_text, args, world_size); });
}

bool mentions(const std::vector<std::string>& warnings, const std::string& text) {
  for (const auto& w : warnings) {
    if (w.find(text) != std::string::npos) return true;
  }
  return false;
}

// A ZeRO-2 file as DeepSpeed's tutorials write it.
const char* const kZero2 = R"({
  "train_batch_size": 64,
  "gradient_accumulation_steps": 2,
  "gradient_clipping": 1.0,
  "steps_per_print": 100,
  "wall_clock_breakdown": false,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
  "zero_optimization": {
    "stage": 2,
    "offload_optimizer": {"device": "cpu", "pin_memory": true},
    "allgather_partitions": true,
    "allgather_bucket_size": 2e8,
    "overlap_comm": false,
    "reduce_scatter": true,
    "reduce_bucket_size": 5e7,
    "contiguous_gradients": true
  }
})";

// nlohmann's parser keeps the last of a key given twice: "lr" 0.1 then 3e-4 trained at 3e-4 without a word.
TEST(DeepSpeedConfig, AKeyGivenTwiceIsRefusedNamingTheFileAndTheKey) {
  const std::string top = error_of(R"({"gradient_clipping": 1.0, "train_batch_size": 8, "gradient_clipping": 0.5})");
  EXPECT_NE(top.find("ds_config.json: key 'gradient_clipping' is given twice: keep one"), std::string::npos) << top;
  const std::string nested =
      error_of(R"({"optimizer": {"type": "AdamW", "params": {"lr": 0.1, "eps": 1e-8, "lr": 3e-4}}})");
  EXPECT_NE(nested.find("ds_config.json: key 'optimizer.params.lr' is given twice"), std::string::npos) << nested;
  // The same key in two objects is no duplicate.
  EXPECT_NO_THROW(apply(R"({"fp16": {"enabled": false}, "bf16": {"enabled": false}})"));
}

TEST(DeepSpeedConfig, ZeroTwoFileMapsOntoTheConfig) {
  const Applied a = apply(kZero2, {}, /*world_size=*/4);
  const TrainConfig& c = a.config;
  EXPECT_EQ(c.run.strategy, "zero2");
  EXPECT_TRUE(c.sharding.offload_optimizer);
  EXPECT_FALSE(c.sharding.offload_params);
  EXPECT_FALSE(c.sharding.overlap_comm);
  EXPECT_TRUE(c.sharding.contiguous_gradients);
  // Elements of fp32 gradients: 5e7 x 4 bytes, in MiB. The all-gather has no bucket of its own to size: named.
  EXPECT_DOUBLE_EQ(c.sharding.allgather_bucket_mb, ptrain::config::ShardingConfig{}.allgather_bucket_mb);
  EXPECT_TRUE(mentions(a.warnings, "'zero_optimization.allgather_bucket_size'"));
  EXPECT_DOUBLE_EQ(c.sharding.reduce_bucket_mb, 5e7 * 4 / (1024.0 * 1024.0));
  EXPECT_EQ(c.run.batch_size, 8);  // 64 / (2 x 4)
  EXPECT_EQ(c.optim.grad_accum, 2);
  EXPECT_DOUBLE_EQ(c.optim.clip_grad_norm, 1.0);
  EXPECT_EQ(c.optim.name, "adamw");
  EXPECT_DOUBLE_EQ(c.optim.lr, 3e-4);
  EXPECT_DOUBLE_EQ(c.optim.beta2, 0.95);
  EXPECT_DOUBLE_EQ(c.optim.weight_decay, 0.1);
  EXPECT_EQ(c.precision.precision, "fp32");
  // Keys without effect on the result are named, not dropped.
  for (const char* key : {"steps_per_print", "wall_clock_breakdown", "zero_optimization.allgather_partitions",
                          "zero_optimization.reduce_scatter", "zero_optimization.offload_optimizer.pin_memory"}) {
    EXPECT_TRUE(mentions(a.warnings, "'" + std::string(key) + "'")) << key;
  }
}

// Bucket and buffer keys land where they act under the stage's strategy, or are named in a warning.
TEST(DeepSpeedConfig, BucketKeysActUnderTheirStageOrAreNamed) {
  const Applied ddp = apply(R"({"zero_optimization": {"stage": 0, "reduce_bucket_size": 1048576}})");
  EXPECT_EQ(ddp.config.run.strategy, "ddp");
  EXPECT_DOUBLE_EQ(ddp.config.dist.bucket_cap_mb, 4.0);
  EXPECT_DOUBLE_EQ(ddp.config.sharding.reduce_bucket_mb, ptrain::config::ShardingConfig{}.reduce_bucket_mb);
  const Applied three = apply(R"({"zero_optimization": {"stage": 3, "reduce_bucket_size": 1048576}})");
  EXPECT_DOUBLE_EQ(three.config.sharding.reduce_bucket_mb, ptrain::config::ShardingConfig{}.reduce_bucket_mb);
  EXPECT_TRUE(mentions(three.warnings, "'zero_optimization.reduce_bucket_size'"));
  const Applied apart = apply(R"({"zero_optimization": {"stage": 2, "contiguous_gradients": false}})");
  EXPECT_TRUE(apart.config.sharding.contiguous_gradients);
  EXPECT_TRUE(mentions(apart.warnings, "'zero_optimization.contiguous_gradients'"));
}

TEST(DeepSpeedConfig, StagesMapToStrategies) {
  EXPECT_EQ(apply(R"({"zero_optimization": {"stage": 0}})").config.run.strategy, "ddp");
  EXPECT_EQ(apply(R"({"zero_optimization": {"stage": 1}})").config.run.strategy, "zero1");
  const TrainConfig c = apply(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"},
      "stage3_max_live_parameters": 1e9, "stage3_prefetch_bucket_size": "auto"}})").config;
  EXPECT_EQ(c.run.strategy, "zero3");
  EXPECT_TRUE(c.sharding.offload_params);
  EXPECT_NE(error_of(R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})")
                .find("zero_optimization.offload_param"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"zero_optimization": {"stage": 4}})").find("zero_optimization.stage"), std::string::npos);
  EXPECT_NE(error_of(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}})").find("nvme"),
            std::string::npos);
}

TEST(DeepSpeedConfig, BatchArithmeticDerivesTheMissingOne) {
  const auto sizes = [](std::optional<int64_t> t, std::optional<int64_t> m, std::optional<int64_t> a, int64_t w) {
    return resolve_batch_sizes({t, "train_batch_size"}, {m, "train_micro_batch_size_per_gpu"},
                               {a, "gradient_accumulation_steps"}, w);
  };
  const auto same = [](const BatchSizes& s, int64_t m, int64_t a, int64_t t) {
    return s.micro_batch == m && s.accumulation == a && s.train_batch == t;
  };
  EXPECT_TRUE(same(sizes(256, 16, std::nullopt, 4), 16, 4, 256));  // accumulation derived
  EXPECT_TRUE(same(sizes(256, std::nullopt, 2, 4), 32, 2, 256));   // micro batch derived
  EXPECT_TRUE(same(sizes(std::nullopt, 16, 2, 4), 16, 2, 128));    // train batch derived
  EXPECT_TRUE(same(sizes(256, std::nullopt, std::nullopt, 4), 64, 1, 256));
  EXPECT_TRUE(same(sizes(std::nullopt, 16, std::nullopt, 3), 16, 1, 48));
  EXPECT_TRUE(same(sizes(96, 16, 2, 3), 16, 2, 96));  // all three, consistent

  const std::string contradiction = ptrain::testing::error_message<ptrain::Error>([&] { sizes(100, 16, 2, 4); });
  for (const char* text : {"train_batch_size 100", "train_micro_batch_size_per_gpu 16", "gradient_accumulation_steps 2",
                           "world size 4", "= 128"}) {
    EXPECT_NE(contradiction.find(text), std::string::npos) << contradiction;
  }
  const std::string indivisible = ptrain::testing::error_message<ptrain::Error>([&] { sizes(100, 16, std::nullopt, 4); });
  EXPECT_NE(indivisible.find("not divisible"), std::string::npos) << indivisible;
}

TEST(DeepSpeedConfig, BatchKeysInTheFileUseTheWorldSizeAndFlagsWin) {
  const char* const file = R"({"train_batch_size": 96, "train_micro_batch_size_per_gpu": 8})";
  const Applied derived = apply(file, {}, 3);
  EXPECT_EQ(derived.config.run.batch_size, 8);
  EXPECT_EQ(derived.config.optim.grad_accum, 4);  // 96 / (8 x 3)

  // A flag replaces the file's value before the arithmetic, and a contradiction names where each number came from.
  const std::string message = error_of(R"({"train_batch_size": 96, "train_micro_batch_size_per_gpu": 8,
                                          "gradient_accumulation_steps": 4})",
                                       {"--batch-size", "16"}, 3);
  EXPECT_NE(message.find("--batch-size 16"), std::string::npos) << message;
  EXPECT_NE(message.find("train_batch_size 96"), std::string::npos) << message;
  EXPECT_EQ(apply(file, {"--batch-size", "16"}, 3).config.optim.grad_accum, 2);

  // "auto" (accelerate and the HF Trainer) takes ptrain's own values; train_batch_size follows.
  const Applied automatic = apply(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
                                     "gradient_accumulation_steps": "auto"})",
                                  {"--batch-size", "24", "--grad-accum", "3"}, 2);
  EXPECT_EQ(automatic.config.run.batch_size, 24);
  EXPECT_EQ(automatic.config.optim.grad_accum, 3);
}

TEST(DeepSpeedConfig, Fp16BlockSetsDeepSpeedsLossScalerRules) {
  const TrainConfig c = apply(R"({"fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12,
                                 "loss_scale_window": 500, "hysteresis": 2, "min_loss_scale": 4}})")
                            .config;
  EXPECT_EQ(c.precision.precision, "fp16");
  EXPECT_TRUE(c.precision.master_weights);  // DeepSpeed keeps fp32 master weights in the optimizer
  EXPECT_EQ(c.precision.loss_scale, "dynamic");
  EXPECT_DOUBLE_EQ(c.precision.initial_loss_scale, 4096.0);
  EXPECT_EQ(c.precision.loss_scale_window, 500);
  EXPECT_EQ(c.precision.hysteresis, 2);
  EXPECT_FALSE(c.precision.consecutive_hysteresis);  // DeepSpeed's default
  EXPECT_DOUBLE_EQ(c.precision.min_loss_scale, 4.0);

  // Left out: DeepSpeed's defaults, not GradScaler's.
  const TrainConfig d = apply(R"({"fp16": {"enabled": true}})").config;
  EXPECT_DOUBLE_EQ(d.precision.initial_loss_scale, 65536.0);
  EXPECT_EQ(d.precision.loss_scale_window, 1000);
  EXPECT_EQ(d.precision.hysteresis, 2);
  EXPECT_DOUBLE_EQ(d.precision.min_loss_scale, 1.0);

  // A static scale; the dynamic keys beside it are named as without effect.
  const Applied s = apply(R"({"fp16": {"enabled": true, "loss_scale": 128, "hysteresis": 2}})");
  EXPECT_EQ(s.config.precision.loss_scale, "128");
  EXPECT_TRUE(mentions(s.warnings, "'fp16.hysteresis'"));

  // A --precision flag wins; master weights then only go with a pure half mode.
  const Applied amp = apply(R"({"fp16": {"enabled": true, "hysteresis": 4}})", {"--precision", "amp-fp16"});
  EXPECT_EQ(amp.config.precision.precision, "amp-fp16");
  EXPECT_FALSE(amp.config.precision.master_weights);
  EXPECT_EQ(amp.config.precision.hysteresis, 4);
  EXPECT_TRUE(mentions(amp.warnings, "'fp16.enabled' (fp16) is overridden by --precision amp-fp16"));

  // "auto" follows ptrain's --precision.
  EXPECT_EQ(apply(R"({"fp16": {"enabled": "auto"}})", {"--precision", "amp-fp16"}).config.precision.loss_scale_window,
            1000);
  EXPECT_EQ(apply(R"({"fp16": {"enabled": "auto"}})").config.precision.precision, "fp32");
}

TEST(DeepSpeedConfig, Bf16AndAutocastAndTheirConflicts) {
  const TrainConfig b = apply(R"({"bf16": {"enabled": true}})").config;
  EXPECT_EQ(b.precision.precision, "bf16");
  EXPECT_TRUE(b.precision.master_weights);
  // Half-precision gradients: DeepSpeed's element counts become half as many bytes.
  const TrainConfig half = apply(R"({"bf16": {"enabled": true}, "zero_optimization": {"stage": 2,
                                    "reduce_bucket_size": 1048576}})").config;
  EXPECT_DOUBLE_EQ(half.sharding.reduce_bucket_mb, 2.0);
  EXPECT_EQ(apply(R"({"torch_autocast": {"enabled": true, "dtype": "bfloat16"}})").config.precision.precision,
            "amp-bf16");
  EXPECT_NE(error_of(R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})").find("both enabled"),
            std::string::npos);
}

TEST(DeepSpeedConfig, OptimizersAreMappedOnlyWhereTheyAreTheSame) {
  const TrainConfig adam = apply(R"({"optimizer": {"type": "Adam", "params": {"lr": 0.001}}})").config;
  EXPECT_EQ(adam.optim.name, "adamw");  // adam_w_mode defaults to true
  EXPECT_DOUBLE_EQ(adam.optim.weight_decay, 0.0);  // FusedAdam's default, not ptrain's
  EXPECT_NE(error_of(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})")
                .find("optimizer.params.adam_w_mode"),
            std::string::npos);
  const TrainConfig sgd = apply(R"({"optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}}})").config;
  EXPECT_EQ(sgd.optim.name, "sgd");
  EXPECT_DOUBLE_EQ(sgd.optim.momentum, 0.9);
  EXPECT_DOUBLE_EQ(sgd.optim.weight_decay, 0.0);  // torch.optim.SGD's default
  EXPECT_NE(error_of(R"({"optimizer": {"type": "Lamb", "params": {}}})").find("'Lamb'"), std::string::npos);
  // Flags win, and "auto" keeps ptrain's value.
  const Applied flagged = apply(R"({"optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": "auto"}}})",
                                {"--lr", "0.5", "--weight-decay", "0.25"});
  EXPECT_DOUBLE_EQ(flagged.config.optim.lr, 0.5);
  EXPECT_DOUBLE_EQ(flagged.config.optim.weight_decay, 0.25);
  EXPECT_TRUE(mentions(flagged.warnings, "'optimizer.params.lr' (0.01) is overridden by --lr"));
}

// The Hugging Face Trainer's ZeRO-2 template: "auto" lr became ptrain's default 0.1 (SGD's) under AdamW and
// clipping stayed off, without a word. "auto" takes ptrain's flag, each said in one line; a rate with nothing to
// take it from is an error naming the key.
const char* const kHuggingFaceZero2 = R"({
  "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
           "hysteresis": 2, "min_loss_scale": 1},
  "bf16": {"enabled": "auto"},
  "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
  "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                               "warmup_num_steps": "auto"}},
  "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": true},
                        "allgather_partitions": true, "allgather_bucket_size": 2e8, "overlap_comm": true,
                        "reduce_scatter": true, "reduce_bucket_size": "auto", "contiguous_gradients": true},
  "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
  "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": false
})";

TEST(DeepSpeedConfig, AutoKeysOfTheHuggingFaceTemplateTakePtrainsFlagsEachSaidInALine) {
  const std::string no_lr = error_of(kHuggingFaceZero2);
  EXPECT_NE(no_lr.find("ds_config.json: key 'optimizer.params.lr' is \"auto\", which takes --lr, and no --lr is "
                       "given"),
            std::string::npos) << no_lr;

  const Applied a = apply(kHuggingFaceZero2, {"--lr", "3e-4", "--clip-grad-norm", "1", "--batch-size", "16",
                                              "--warmup-steps", "10"}, 2);
  EXPECT_EQ(a.config.optim.name, "adamw");
  EXPECT_DOUBLE_EQ(a.config.optim.lr, 3e-4);
  EXPECT_DOUBLE_EQ(a.config.optim.clip_grad_norm, 1.0);
  EXPECT_EQ(a.config.optim.warmup_steps, 10);
  EXPECT_EQ(a.config.run.batch_size, 16);
  EXPECT_EQ(a.config.run.strategy, "zero2");
  for (const std::string line :
       {"key 'optimizer.params.lr' is \"auto\": --lr 0.0003", "key 'scheduler.params.warmup_max_lr' is \"auto\": --lr 0.0003",
        "key 'optimizer.params.betas' is \"auto\": --beta1 0.9 (ptrain's default)",
        "key 'optimizer.params.betas' is \"auto\": --beta2 0.999 (ptrain's default)",
        "key 'optimizer.params.eps' is \"auto\": --eps 1e-08 (ptrain's default)",
        "key 'optimizer.params.weight_decay' is \"auto\": --weight-decay 0.0005 (ptrain's default)",
        "key 'gradient_clipping' is \"auto\": --clip-grad-norm 1", "key 'fp16.enabled' is \"auto\": --precision fp32",
        "key 'scheduler.params.warmup_num_steps' is \"auto\": --warmup-steps 10",
        "key 'scheduler.params.warmup_min_lr' is \"auto\": --warmup-min-lr 0 (ptrain's default)",
        "key 'train_micro_batch_size_per_gpu' is \"auto\": --batch-size 16",
        "key 'gradient_accumulation_steps' is \"auto\": --grad-accum 1 (ptrain's default)",
        "key 'train_batch_size' is \"auto\": --global-batch-size 32 (--batch-size x --grad-accum x 2 processes)",
        "key 'zero_optimization.reduce_bucket_size' is \"auto\": --reduce-bucket-mb 25 (ptrain's default)"}) {
    EXPECT_TRUE(mentions(a.warnings, "ds_config.json: " + line)) << line;
  }
  // Under SGD ptrain's default rate is SGD's own; clipping off is said, not silent.
  const Applied sgd = apply(R"({"optimizer": {"type": "SGD", "params": {"lr": "auto"}}, "gradient_clipping": "auto"})");
  EXPECT_DOUBLE_EQ(sgd.config.optim.lr, 0.1);
  EXPECT_TRUE(mentions(sgd.warnings, "key 'gradient_clipping' is \"auto\": --clip-grad-norm 0 (off) (ptrain's default)"));
  EXPECT_NE(error_of(R"({"optimizer": {"type": "AdamW", "params": {"amsgrad": "auto"}}})").find(
                "'optimizer.params.amsgrad' is \"auto\", and ptrain has no setting to take it from"),
            std::string::npos);
}

TEST(DeepSpeedConfig, SchedulersMapToPtrainsSchedulesOfTheSameName) {
  const TrainConfig w = apply(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0,
      "warmup_max_lr": 0.002, "warmup_num_steps": 50, "warmup_type": "linear"}}})").config;
  EXPECT_EQ(w.optim.schedule, "WarmupLR");
  EXPECT_DOUBLE_EQ(w.optim.lr, 0.002);
  EXPECT_EQ(w.optim.warmup_steps, 50);
  EXPECT_EQ(w.optim.warmup_type, "linear");

  const TrainConfig cos = apply(R"({"optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
      "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 1000, "warmup_num_steps": 10,
      "warmup_min_ratio": 0.2, "cos_min_ratio": 0.1}}})").config;
  EXPECT_EQ(cos.optim.schedule, "WarmupCosineLR");
  EXPECT_DOUBLE_EQ(cos.optim.min_lr, 0.001);
  EXPECT_DOUBLE_EQ(cos.optim.warmup_min_lr, 0.002);
  EXPECT_EQ(cos.optim.warmup_type, "log");  // DeepSpeed's default
  EXPECT_EQ(cos.run.max_steps, 1000);

  // DeepSpeed's defaults: a log warm-up of 1000 steps; WarmupDecayLR peaks at 0.001, WarmupLR at the optimizer's lr.
  const TrainConfig log = apply(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}})").config;
  EXPECT_EQ(log.optim.warmup_type, "log");
  EXPECT_DOUBLE_EQ(log.optim.lr, 0.1);
  const TrainConfig decay = apply(R"({"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 3000}}})").config;
  EXPECT_EQ(decay.optim.schedule, "WarmupDecayLR");
  EXPECT_DOUBLE_EQ(decay.optim.lr, 0.001);
  EXPECT_EQ(decay.optim.warmup_steps, 1000);
  EXPECT_EQ(decay.run.max_steps, 3000);
  // Flags win over the file, named.
  const Applied flagged = apply(R"({"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 30,
      "warmup_type": "log", "warmup_min_lr": 0.01}}})", {"--warmup-type", "linear", "--warmup-min-lr", "0.02"});
  EXPECT_EQ(flagged.config.optim.warmup_type, "linear");
  EXPECT_DOUBLE_EQ(flagged.config.optim.warmup_min_lr, 0.02);
  EXPECT_TRUE(mentions(flagged.warnings, "'scheduler.params.warmup_type' (log) is overridden by --warmup-type linear"));

  const std::string no_total = error_of(R"({"scheduler": {"type": "WarmupDecayLR", "params": {}}})");
  EXPECT_NE(no_total.find("key 'scheduler.params.total_num_steps' is required for WarmupDecayLR"), std::string::npos)
      << no_total;
  const std::string misspelt = error_of(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "lin"}}})");
  EXPECT_NE(misspelt.find("key 'scheduler.params.warmup_type' must be log or linear"), std::string::npos) << misspelt;
  const std::string other = error_of(R"({"scheduler": {"type": "OneCycle", "params": {}}})");
  EXPECT_NE(other.find("'OneCycle' has no ptrain equivalent (supported: WarmupLR, WarmupDecayLR, WarmupCosineLR)"),
            std::string::npos) << other;
  EXPECT_NE(error_of(R"({"scheduler": {"type": "WarmupLR", "params": {"total_num_steps": 10}}})")
                .find("'scheduler.params.total_num_steps' is not a WarmupLR parameter"),
            std::string::npos);
}

TEST(DeepSpeedConfig, UnknownKeysAreRejectedByName) {
  for (const char* file : {R"({"train_batch_size": 8, "zero_optimisation": {"stage": 2}})",
                           R"({"zero_optimization": {"stage": 2, "overlap_communication": true}})",
                           R"({"fp16": {"enabled": true, "initial_scale": 16}})",
                           R"({"optimizer": {"type": "AdamW", "params": {"learning_rate": 0.1}}})"}) {
    const std::string message = error_of(file);
    for (const char* name : {"zero_optimisation", "overlap_communication", "initial_scale", "learning_rate"}) {
      if (std::string(file).find(name) != std::string::npos) {
        EXPECT_NE(message.find(name), std::string::npos) << message;
      }
    }
  }
  EXPECT_NE(error_of("{not json").find("not valid JSON"), std::string::npos);
}

TEST(TrainOptions, EveryFlagAlsoReadsItsEnvironmentVariable) {
  EXPECT_EQ(ptrain::config::env_name_of("fsdp-sharding"), "PTRAIN_FSDP_SHARDING");
  ::setenv("PTRAIN_FSDP_SHARDING", "shard-grad-op", 1);
  ::setenv("PTRAIN_FORWARD_PREFETCH", "true", 1);
  ::setenv("PTRAIN_SYNC_MODULE_STATES", "false", 1);
  TrainConfig config;
  CLI::App app;
  ptrain::config::add_train_options(app, config);
  const char* argv[] = {"train", "--no-forward-prefetch"};
  app.parse(2, const_cast<char**>(argv));
  ::unsetenv("PTRAIN_FSDP_SHARDING");
  ::unsetenv("PTRAIN_FORWARD_PREFETCH");
  ::unsetenv("PTRAIN_SYNC_MODULE_STATES");
  EXPECT_EQ(config.sharding.fsdp_sharding, "shard-grad-op");
  EXPECT_FALSE(config.sharding.forward_prefetch);  // the flag wins
  EXPECT_FALSE(config.sharding.sync_module_states);
}

}  // namespace
