#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cmath>
#include <future>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "command.h"
#include "multiprocess.h"
#include "temp_dir.h"

namespace {

namespace fs = std::filesystem;

using Result = ptrain::testing::CommandResult;

Result run_shell(const std::string& command_line) { return ptrain::testing::run_command(command_line); }

Result run(const std::string& args) { return run_shell(std::string(PTRAIN_EXECUTABLE) + " " + args); }

fs::path scratch(const std::string& name) { return ptrain::testing::fresh_named_dir("cli_" + name); }

const std::string kSmallRun =
    "train --model resnet20 --dataset synthetic --data-path 256:3x16x16:4 --batch-size 16 --epochs 2 "
    "--device cpu --progress lines --log-every 4 --test-limit 64 ";

TEST(Cli, TrainsAndWritesTheMetricsRecord) {
  const auto dir = scratch("train");
  const auto metrics = dir / "sub" / "run.json";
  const Result r = run(kSmallRun + "--metrics-out " + metrics.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("result: test accuracy"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("epoch 2:"), std::string::npos) << r.output;
  std::ifstream in(metrics);
  ASSERT_TRUE(in.good()) << "no metrics file at " << metrics;
  const auto json = nlohmann::json::parse(in);
  EXPECT_EQ(json["schema_version"], 1);
  EXPECT_EQ(json["framework"], "ptrain");
  EXPECT_FALSE(json["ptrain_version"].get<std::string>().empty());
  EXPECT_EQ(json["steps"], 2 * (256 / 16));
  EXPECT_EQ(json["epochs_detail"].size(), 2u);
  EXPECT_EQ(json["kernels"]["batch_norm_relu"], "reference") << "a CPU run of the zoo's ResNet";
  // ResNet-20's 0.27 M parameters: weights, gradients and momentum alone hold 3.2 MB of CPU tensors.
  ASSERT_TRUE(json["peak_allocated_bytes"].is_number()) << json.dump(2);
  EXPECT_GT(json["peak_allocated_bytes"].get<int64_t>(), 3200000);
  EXPECT_LT(json["peak_allocated_bytes"].get<int64_t>(), 1ll << 30);
  EXPECT_TRUE(json["peak_reserved_bytes"].is_null()) << "no caching allocator on the CPU: must be null";
  EXPECT_GT(json["images_per_second"].get<double>(), 0.0);
  EXPECT_GE(json["final_test_accuracy"].get<double>(), 0.0);
  // 32 steps: the steady clock starts after a quarter of them and runs on across the epoch boundary.
  EXPECT_EQ(json["steady_from_step"], 8);
  // Steady throughput leaves out the first steps' warm-up, which on two busy cores (tests run in parallel) can take
  // a few times a steady step's time: the bounds catch a window or a count off by an order of magnitude, not load.
  const double steady = json["steady_images_per_second"].get<double>();
  EXPECT_GT(steady, 0.5 * json["images_per_second"].get<double>());
  EXPECT_LT(steady, 10.0 * json["images_per_second"].get<double>());
  EXPECT_NE(r.output.find(" after step 8)"), std::string::npos) << r.output;
}

// --skip-fusions: the record says which fused paths a run left out, from the command line or a variable; a name
// that is no fusion, or a fusion the run would not take (the batch norms' on the CPU), stops it before it starts.
TEST(Cli, SkippedFusionsReachTheRecord) {
  const auto dir = scratch("skip_fusions");
  const auto metrics = dir / "run.json";
  const Result r = run_shell("PTRAIN_SKIP_FUSIONS=weight-casts " + std::string(PTRAIN_EXECUTABLE) + " " + kSmallRun +
                             "--precision amp-bf16 --max-steps 2 --metrics-out " + metrics.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(metrics);
  const auto json = nlohmann::json::parse(in);
  EXPECT_EQ(json["kernels"]["skipped_fusions"], "weight-casts") << json["kernels"].dump();
  EXPECT_EQ(json["extra"]["config"]["run"]["skip_fusions"], nlohmann::json({"weight-casts"}));
  const Result typo = run(kSmallRun + "--precision amp-bf16 --skip-fusions weight-casts,twins --dry-run");
  EXPECT_EQ(typo.exit_code, 2) << typo.output;
  EXPECT_NE(typo.output.find("--skip-fusions: 'twins' is not a fusion"), std::string::npos) << typo.output;
  const Result cpu = run(kSmallRun + "--precision amp-bf16 --skip-fusions weight-casts,stem-pool --dry-run");
  EXPECT_EQ(cpu.exit_code, 2) << cpu.output;
  EXPECT_NE(cpu.output.find("--skip-fusions stem-pool: the batch norms' fused kernels run on CUDA only"),
            std::string::npos)
      << cpu.output;
}

TEST(Cli, DryRunPrintsThePlanWithoutTraining) {
  const Result r = run(kSmallRun + "--dry-run --precision bf16 --master-weights --grad-accum 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("precision bf16 with fp32 master weights"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("global batch 32"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("result:"), std::string::npos) << r.output;
}

// The last line a command printed ("ptrain: error: ...").
std::string last_line(const std::string& output) {
  std::string text = output;
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text.substr(text.rfind('\n') + 1);
}

// --dry-run runs train's own checks of the data and the model against it: what train refuses, it refuses with
// the same line, and nothing trains.
TEST(Cli, DryRunRefusesWhatTrainRefuses) {
  // CIFAR-10's binary release with 4 training records a batch file and an empty test batch.
  const auto cifar = scratch("dry_run_cifar");
  for (int i = 1; i <= 5; ++i) {
    std::ofstream out(cifar / ("data_batch_" + std::to_string(i) + ".bin"), std::ios::binary);
    for (int record = 0; record < 4; ++record) out << static_cast<char>(record) << std::string(3072, '\x40');
  }
  std::ofstream(cifar / "test_batch.bin", std::ios::binary).flush();
  const std::string cpu = "--device cpu --batch-size 8 --max-steps 1 --progress none ";
  const std::string images = "--dataset synthetic --data-path 64:1x8x8:10 ";
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"--model resnet20 --dataset cifar10 --data-path " + cifar.string(), "holds no CIFAR-10 records"},
      {"--model resnet20 " + images + "--normalize 0.1,0.2,0.3/0.4,0.5,0.6", "3 values a channel"},
      {"--model gpt-tiny " + images, "--model gpt-tiny is a language model"},
      {"--model resnet20 --dataset synthetic-tokens --data-path 64:16:8", "--model resnet20 is an image model"},
      {"--model " + std::string(PTRAIN_TORCHSCRIPT_FIXTURES) + "/net.pt --dataset synthetic --data-path 64:3x16x16:10",
       "expected logits [2, 10]"},
  };
  for (const auto& [args, why] : refused) {
    const Result dry = run("train --dry-run " + cpu + args);
    EXPECT_EQ(dry.exit_code, 2) << args << "\n" << dry.output;
    EXPECT_NE(last_line(dry.output).find(why), std::string::npos) << args << "\n" << dry.output;
    const Result trained = run("train " + cpu + args);
    EXPECT_EQ(trained.exit_code, 2) << args << "\n" << trained.output;
    EXPECT_EQ(last_line(dry.output), last_line(trained.output)) << args;
  }
}

TEST(Cli, DryRunShowsWhatADeepSpeedConfigBecomes) {
  const auto dir = scratch("deepspeed");
  const auto ds_config = dir / "ds_config.json";
  std::ofstream(ds_config) << R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 8,
    "gradient_clipping": 0.5, "steps_per_print": 10, "bf16": {"enabled": true},
    "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "weight_decay": 0.01}}, "zero_optimization": {"stage": 0}})";
  const Result r = run(kSmallRun + "--dry-run --deepspeed-config " + ds_config.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // kSmallRun's --batch-size 16 wins over the file's micro batch; the accumulation follows from train_batch_size.
  for (const char* text : {"precision bf16 with fp32 master weights", "strategy ddp", "batch 16 per device x 2 accumulation",
                           "global batch 32", "optimizer adamw lr 0.001", "clip norm 0.5", "'steps_per_print'",
                           "'train_micro_batch_size_per_gpu' (8) is overridden by --batch-size 16"}) {
    EXPECT_NE(r.output.find(text), std::string::npos) << text << "\n" << r.output;
  }
  std::ofstream(ds_config) << R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 4})";
  const Result bad = run(kSmallRun + "--dry-run --deepspeed-config " + ds_config.string());
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("train_batch_size 30 disagrees"), std::string::npos) << bad.output;
}

// `ptrain estimate` reads a ds_config as `train` does: bf16 with fp32 masters under zero2, the file's
// micro batch.
TEST(Cli, EstimateHonoursADeepSpeedConfig) {
  const auto dir = scratch("estimate_deepspeed");
  const auto ds_config = dir / "ds_config.json";
  std::ofstream(ds_config) << R"({"train_micro_batch_size_per_gpu": 8, "bf16": {"enabled": true},
    "zero_optimization": {"stage": 2}})";
  const std::string job = "--model resnet20 --dataset synthetic --data-path 256:3x16x16:4 --device cpu --threads 1 "
                          "--deepspeed-config " + ds_config.string();
  const Result planned = run("train --dry-run " + job);
  ASSERT_EQ(planned.exit_code, 0) << planned.output;
  for (const char* text : {"precision bf16 with fp32 master weights", "strategy zero2", "batch 8 per device"})
    EXPECT_NE(planned.output.find(text), std::string::npos) << text << "\n" << planned.output;

  const auto json_path = dir / "estimate.json";
  const Result r = run("estimate --devices 2 --json " + json_path.string() + " " + job);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(json_path);
  const auto estimate = nlohmann::json::parse(in);
  EXPECT_EQ(estimate["precision"], "bf16+master") << estimate.dump(2);
  EXPECT_EQ(estimate["configured_strategy"], "zero2") << estimate.dump(2);
  EXPECT_EQ(estimate["batch_size_per_device"], 8) << estimate.dump(2);
  EXPECT_NE(r.output.find("| zero2 (configured) |"), std::string::npos) << r.output;
}

// --param-dtype bf16 under fsdp trains bf16 parameters on fp32 master shards: the model-state line of the
// dry run counts those masters, as its precision line says.
TEST(Cli, DryRunMastersAgreeWithTheFsdpParamDtype) {
  const Result r = run(kSmallRun + "--dry-run --strategy fsdp --param-dtype bf16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("with fp32 master weights"), std::string::npos) << r.output;
  const auto at = r.output.find("fp32 masters ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const double masters_mib = std::stod(r.output.substr(at + std::string("fp32 masters ").size()));
  // ResNet-20's 0.27 M parameters: an fp32 copy and its gradient, 2 x 4 bytes each, on the one rank.
  EXPECT_GT(masters_mib, 1.5) << r.output;
}

TEST(Cli, BadInputIsNamed) {
  const Result precision = run("train --precision fp9");
  EXPECT_NE(precision.exit_code, 0);
  EXPECT_NE(precision.output.find("--precision"), std::string::npos) << precision.output;

  const Result master = run(kSmallRun + "--precision fp32 --master-weights");
  EXPECT_NE(master.exit_code, 0);
  EXPECT_NE(master.output.find("--master-weights"), std::string::npos) << master.output;

  const Result data = run("train --dataset cifar10 --data-path /nonexistent/cifar --device cpu");
  EXPECT_NE(data.exit_code, 0);
  EXPECT_NE(data.output.find("/nonexistent/cifar"), std::string::npos) << data.output;

  const auto dir = scratch("badconfig");
  std::ofstream(dir / "c.yaml") << "epochs: 1\nbatchsize: 3\n";
  const Result config = run("train --config " + (dir / "c.yaml").string());
  EXPECT_NE(config.exit_code, 0);
  EXPECT_NE(config.output.find("batchsize"), std::string::npos) << config.output;

  const Result resume = run(kSmallRun + "--resume /nonexistent/step.safetensors");
  EXPECT_NE(resume.exit_code, 0);
  EXPECT_NE(resume.output.find("/nonexistent/step.safetensors"), std::string::npos) << resume.output;

  const Result dp_cpu = run(kSmallRun + "--strategy dp");
  EXPECT_NE(dp_cpu.exit_code, 0);
  EXPECT_NE(dp_cpu.output.find("--replicas"), std::string::npos) << dp_cpu.output;

  const Result replicas = run(kSmallRun + "--replicas 2");
  EXPECT_NE(replicas.exit_code, 0);
  EXPECT_NE(replicas.output.find("--replicas applies to --strategy dp"), std::string::npos) << replicas.output;

  const Result dp_sync = run(kSmallRun + "--strategy dp --replicas 2 --sync-batchnorm");
  EXPECT_NE(dp_sync.exit_code, 0);
  EXPECT_NE(dp_sync.output.find("--sync-batchnorm"), std::string::npos) << dp_sync.output;
}

TEST(Cli, DpDrivesReplicasFromOneProcessAndItsCheckpointResumesOnOneDevice) {
  const auto dir = scratch("dp");
  const auto metrics = dir / "dp.json";
  const auto ckpt = dir / "ckpt";
  std::string one_epoch = kSmallRun;
  one_epoch.replace(one_epoch.find("--epochs 2"), 10, "--epochs 1");
  const Result r = run(one_epoch + "--strategy dp --replicas 2 --checkpoint-dir " + ckpt.string() +
                       " --metrics-out " + metrics.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("x 2 replicas = global batch 32"), std::string::npos) << r.output;
  std::ifstream in(metrics);
  ASSERT_TRUE(in.good()) << r.output;
  const auto json = nlohmann::json::parse(in);
  EXPECT_EQ(json["strategy"], "dp");
  EXPECT_EQ(json["world_size"], 1);
  EXPECT_EQ(json["devices"], 2);
  EXPECT_EQ(json["global_batch_size"], 32);
  EXPECT_EQ(json["steps"], 256 / 32);  // each step takes two replicas' batches

  const Result resumed = run(kSmallRun + "--checkpoint-dir " + ckpt.string() + " --resume latest");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resuming a checkpoint of 2 device(s) x batch 16 with 1 x 16"), std::string::npos)
      << resumed.output;
  EXPECT_NE(resumed.output.find("epoch 2:"), std::string::npos) << resumed.output;
}

TEST(Cli, DdpOverGlooUnderLaunchTrainsOnEveryRank) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  const auto dir = scratch("ddp");
  const auto metrics = dir / "ddp.json";
  const int port = ptrain::testing::free_port();
  const Result r = run("launch --nproc-per-node 2 --master-port " + std::to_string(port) + " --timeout 240 -- " +
                       PTRAIN_EXECUTABLE + " " + kSmallRun + "--strategy ddp --dist-timeout 60 --metrics-out " +
                       metrics.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 0]"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("[rank 1]"), std::string::npos) << "rank 0 alone prints\n" << r.output;
  EXPECT_NE(r.output.find("x 2 processes = global batch 32"), std::string::npos) << r.output;
  std::ifstream in(metrics);
  ASSERT_TRUE(in.good()) << r.output;
  const auto json = nlohmann::json::parse(in);
  EXPECT_EQ(json["world_size"], 2);
  EXPECT_EQ(json["strategy"], "ddp");
  EXPECT_EQ(json["global_batch_size"], 32);
  EXPECT_EQ(json["steps"], 2 * (256 / 32));  // each rank sees half of every epoch
}

TEST(Cli, CheckpointOfTwoProcessesResumesWithThree) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  const auto dir = scratch("resume23");
  const auto run_ddp = [&](int processes, int port, const std::string& extra) {
    // Three processes on a machine of fewer cores are allowed only when asked for.
    return run("launch --allow-oversubscribe --nproc-per-node " + std::to_string(processes) + " --master-port " +
               std::to_string(port) + " --timeout 240 -- " + PTRAIN_EXECUTABLE + " " + kSmallRun + "--strategy ddp --dist-timeout 60 " + extra);
  };
  const int port = ptrain::testing::free_port();
  // 256 samples, 16 per device: 8 steps of 32 samples an epoch on 2 processes; step 3 is mid-epoch.
  const Result two = run_ddp(2, port, "--checkpoint-dir " + (dir / "two").string() + " --checkpoint-every 3");
  ASSERT_EQ(two.exit_code, 0) << two.output;
  const auto checkpoint = dir / "two" / "step-00000003.safetensors";
  ASSERT_TRUE(fs::exists(checkpoint)) << two.output;

  const auto metrics = dir / "three.json";
  const Result three = run_ddp(3, ptrain::testing::free_port(), "--resume " + checkpoint.string() + " --metrics-out " + metrics.string());
  ASSERT_EQ(three.exit_code, 0) << three.output;
  // 96 samples done = 2 steps of 48 on 3 processes (5 steps an epoch): the run ends at step 10.
  EXPECT_NE(three.output.find("continues after about 96 samples, at step 2"), std::string::npos) << three.output;
  const auto json = nlohmann::json::parse(std::ifstream(metrics));
  EXPECT_EQ(json["world_size"], 3);
  EXPECT_EQ(json["steps"], 10);
}

TEST(Cli, LaunchReadsAnAccelerateConfig) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  const auto dir = scratch("accelerate");
  const auto metrics = dir / "run.json";
  const int port = ptrain::testing::free_port();
  const Result r = run("launch --config " + std::string(PTRAIN_SOURCE_DIR) + "/configs/accelerate/multi-cpu-2.yaml " +
                       "--master-port " + std::to_string(port) + " --timeout 240 -- " + PTRAIN_EXECUTABLE + " " +
                       kSmallRun + "--dist-timeout 60 --metrics-out " + metrics.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // main_training_function and same_network, which accelerate writes into every file, change nothing: no warning.
  EXPECT_EQ(r.output.find("main_training_function"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("same_network"), std::string::npos) << r.output;
  const auto json = nlohmann::json::parse(std::ifstream(metrics));
  EXPECT_EQ(json["world_size"], 2);
  EXPECT_EQ(json["strategy"], "ddp");
  EXPECT_EQ(json["precision"], "amp-bf16");
}

// The issue's accelerate FSDP file, unchanged: four processes (on the CPU here) train under fsdp with
// sharded checkpoints, a file a rank beside the one naming them; the checkpoint resumes under ddp on two.
TEST(Cli, AccelerateFsdpConfigRunsAndItsShardedCheckpointResumesUnderDdp) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  const auto dir = scratch("fsdp");
  const auto metrics = dir / "run.json";
  const int port = ptrain::testing::free_port();
  // 256 samples, 16 per device on 4 processes: 4 steps an epoch; two steps are enough.
  const Result r = run("launch --allow-oversubscribe --config " + std::string(PTRAIN_SOURCE_DIR) +
                       "/configs/accelerate/fsdp-4.yaml --master-port " + std::to_string(port) + " --timeout 300 -- " + PTRAIN_EXECUTABLE + " " +
                       kSmallRun + "--dist-timeout 60 --checkpoint-dir " + (dir / "ckpt").string() +
                       " --checkpoint-every 2 --max-steps 2 --metrics-out " + metrics.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("fsdp_use_orig_params"), std::string::npos) << r.output;  // named, not ignored
  const auto json = nlohmann::json::parse(std::ifstream(metrics));
  EXPECT_EQ(json["world_size"], 4);
  EXPECT_EQ(json["strategy"], "fsdp");
  const auto checkpoint = dir / "ckpt" / "step-00000002.safetensors";
  ASSERT_TRUE(fs::exists(checkpoint)) << r.output;
  std::string files = checkpoint.string();
  for (int rank = 0; rank < 4; ++rank) {
    char name[64];
    std::snprintf(name, sizeof(name), "step-00000002.rank-%05d.safetensors", rank);
    EXPECT_TRUE(fs::exists(dir / "ckpt" / name)) << name;
    files += " " + (dir / "ckpt" / name).string();
  }
  // `ptrain verify` on the whole directory: each rank file is checked for what it is, not refused as a
  // checkpoint that is not one.
  const Result verified = run("verify " + files);
  EXPECT_EQ(verified.exit_code, 0) << verified.output;
  EXPECT_NE(verified.output.find("step-00000002.rank-00003.safetensors: ok, rank file 3 of 4 of a sharded checkpoint"),
            std::string::npos)
      << verified.output;
  // The checkpoint's 128 samples are step 4 on two processes: the resumed run trains steps 5 and 6.
  const Result resumed = run("launch --nproc-per-node 2 --master-port " + std::to_string(ptrain::testing::free_port()) + " --timeout 240 -- " +
                             PTRAIN_EXECUTABLE + " " + kSmallRun + "--strategy ddp --dist-timeout 60 --max-steps 6 --resume " +
                             checkpoint.string());
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resuming a checkpoint of 4 device(s)"), std::string::npos) << resumed.output;
}

// A model whose states cannot fit stops with what they take and the strategies that would fit it.
TEST(Cli, OutOfMemoryNamesTheFix) {
  const Result r = run("train --model gpt-tiny --gpt-width 131072 --gpt-heads 1 --dataset synthetic-tokens "
                       "--data-path 64:16:256 --batch-size 4 --max-steps 1 --device cpu --optimizer adamw");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  for (const char* text : {"out of memory on cpu under --strategy single", "bytes a parameter", "--strategy zero3 (or fsdp)",
                           "ptrain estimate"}) {
    EXPECT_NE(r.output.find(text), std::string::npos) << text << "\n" << r.output;
  }
}

TEST(Cli, DryRunShowsTheUnitsAndTheModelStatesPerRank) {
  const Result fsdp = run(kSmallRun + "--dry-run --strategy fsdp --min-num-params 20000");
  ASSERT_EQ(fsdp.exit_code, 0) << fsdp.output;
  for (const char* text : {"fsdp full-shard, auto-wrap size (min_num_params 20,000)", "layer3.2    BasicBlock", "unit 0:",
                           "root:", "model states per rank"}) {
    EXPECT_NE(fsdp.output.find(text), std::string::npos) << text << "\n" << fsdp.output;
  }
  const Result zero2 = run(kSmallRun + "--dry-run --strategy zero2 --reduce-bucket-mb 0.1");
  ASSERT_EQ(zero2.exit_code, 0) << zero2.output;
  EXPECT_NE(zero2.output.find("buckets of at most 0.1 MiB"), std::string::npos) << zero2.output;
  EXPECT_NE(zero2.output.find("bucket 1:"), std::string::npos) << zero2.output;
  // ddp's buckets as its reducer makes them: closed once full, the first at 1 MiB.
  const Result ddp = run(kSmallRun + "--dry-run --strategy ddp --bucket-cap-mb 0.1");
  ASSERT_EQ(ddp.exit_code, 0) << ddp.output;
  EXPECT_NE(ddp.output.find("each closed once it reaches 0.1 MiB (the first at 1 MiB)"), std::string::npos) << ddp.output;
  EXPECT_NE(ddp.output.find("bucket 1:"), std::string::npos) << ddp.output;
}

// Node 1 in the background, node 0 in the foreground: two launchers on loopback make one job.
TEST(Cli, TwoNodesOnLoopbackTrainTogether) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  const auto dir = scratch("twonodes");
  const auto metrics = dir / "run.json";
  const std::string port = std::to_string(ptrain::testing::free_port());
  const auto node = [&](int rank) {
    return run("launch --nnodes 2 --node-rank " + std::to_string(rank) + " --nproc-per-node 1 --master-addr 127.0.0.1" +
               " --master-port " + port + " --timeout 240 -- " + PTRAIN_EXECUTABLE + " " + kSmallRun +
               "--strategy ddp --dist-timeout 60 --metrics-out " + metrics.string());
  };
  auto second = std::async(std::launch::async, node, 1);
  const Result first = node(0);
  const Result other = second.get();
  ASSERT_EQ(first.exit_code, 0) << first.output;
  ASSERT_EQ(other.exit_code, 0) << other.output;
  const auto json = nlohmann::json::parse(std::ifstream(metrics));
  EXPECT_EQ(json["world_size"], 2);
}

// Processes started by hand the way Slurm's srun and OpenMPI's mpirun start them join one job.
TEST(Cli, SlurmAndOpenMpiStartedProcessesJoin) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  const auto dir = scratch("byhand");
  const auto metrics = dir / "run.json";
  const std::string port = std::to_string(ptrain::testing::free_port());
  const std::string train = std::string(PTRAIN_EXECUTABLE) + " " + kSmallRun + "--strategy ddp --dist-timeout 60 ";
  auto openmpi = std::async(std::launch::async, [&] {
    return Result(run_shell("env OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_RANK=1 "
                            "OMPI_COMM_WORLD_LOCAL_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + " " + train));
  });
  const Result slurm = run_shell("env SLURM_PROCID=0 SLURM_NTASKS=2 SLURM_LOCALID=0 SLURM_NTASKS_PER_NODE=2 "
                                 "SLURM_JOB_NODELIST=localhost MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + " " + train +
                                 "--metrics-out " + metrics.string());
  const Result mpi = openmpi.get();
  ASSERT_EQ(slurm.exit_code, 0) << slurm.output;
  ASSERT_EQ(mpi.exit_code, 0) << mpi.output;
  const auto json = nlohmann::json::parse(std::ifstream(metrics));
  EXPECT_EQ(json["world_size"], 2);
}

TEST(Cli, LaunchFailsWhenARankFails) {
  const int port = ptrain::testing::free_port();
  // Rank processes that cannot start training: a bad flag on every rank makes launch exit non-zero.
  const Result r = run("launch --nproc-per-node 2 --master-port " + std::to_string(port) + " --timeout 60 -- " +
                       PTRAIN_EXECUTABLE + " train --strategy ddp --precision fp9");
  EXPECT_NE(r.exit_code, 0) << r.output;
}

}  // namespace

namespace {

const char* kTinySuite = R"(name: tiny
workload: {model: resnet20, dataset: synthetic, data-path: "128:1x28x28:4", batch-size: 16, epochs: 1, test-limit: 32, threads: 1}
runs:
  - {precision: fp32}
  - {precision: fp32, strategy: ddp, devices: 2}
  - {precision: fp32, strategy: dp, devices: 2}
  - {precision: fp32, strategy: zero2, devices: 2}
  - {precision: fp32, strategy: fsdp, devices: 2}
)";

size_t count_of(const std::string& text, const std::string& word) {
  size_t n = 0;
  for (auto at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) ++n;
  return n;
}

TEST(Cli, BenchRunsEverySuiteRunInItsOwnProcessContinuesAndReports) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  const auto dir = scratch("bench");
  std::ofstream(dir / "suite.yaml") << kTinySuite;
  const std::string bench = "bench --gpus 0 --suite " + (dir / "suite.yaml").string() + " --out " + (dir / "out").string();
  const Result r = run(bench);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[1/5] ptrain fp32, single, 1 device (4 to run after this)"), std::string::npos) << r.output;
  EXPECT_EQ(count_of(r.output, "      done: "), 5u) << r.output;
  for (const char* file : {"report.md", "report.csv", "report.html", "bench.json", "workload.yaml"})
    EXPECT_TRUE(fs::is_regular_file(dir / "out" / file)) << file;
  std::ifstream in(dir / "out" / "runs" / "ptrain" / "fp32-ddp-x2.json");
  ASSERT_TRUE(in.good()) << r.output;
  const auto ddp = nlohmann::json::parse(in);
  EXPECT_EQ(ddp["world_size"], 2);
  EXPECT_EQ(ddp["strategy"], "ddp");
  // Each ptrain run logs its steps beside its record (--log-jsonl); the report's loss curve is drawn from them.
  for (const char* id : {"fp32-single-x1", "fp32-ddp-x2", "fp32-dp-x2", "fp32-zero2-x2", "fp32-fsdp-x2"}) {
    std::ifstream log_in(dir / "out" / "runs" / "ptrain" / (std::string(id) + ".log.jsonl"));
    ASSERT_TRUE(log_in.good()) << id << "\n" << r.output;
    size_t logged_steps = 0;
    for (std::string line; std::getline(log_in, line);) logged_steps += nlohmann::json::parse(line)["kind"] == "step";
    EXPECT_GT(logged_steps, 0u) << id;
  }
  std::ifstream html_in(dir / "out" / "report.html");
  const std::string html((std::istreambuf_iterator<char>(html_in)), std::istreambuf_iterator<char>());
  EXPECT_NE(html.find("Every logged step (--log-jsonl) of "), std::string::npos);
  EXPECT_NE(html.find("data-chart=\"throughput-curve\""), std::string::npos);
  std::ifstream dp_in(dir / "out" / "runs" / "ptrain" / "fp32-dp-x2.json");
  const auto dp = nlohmann::json::parse(dp_in);
  EXPECT_EQ(dp["devices"], 2);
  EXPECT_EQ(dp["world_size"], 1);
  // Every run appears in the report, and the report says what the baseline is.
  std::ifstream md_in(dir / "out" / "report.md");
  const std::string md((std::istreambuf_iterator<char>(md_in)), std::istreambuf_iterator<char>());
  for (const char* id : {"fp32-single-x1", "fp32-ddp-x2", "fp32-dp-x2", "fp32-zero2-x2", "fp32-fsdp-x2"})
    EXPECT_NE(md.find(id), std::string::npos) << md;
  std::ifstream zero_in(dir / "out" / "runs" / "ptrain" / "fp32-zero2-x2.json");
  const auto zero2 = nlohmann::json::parse(zero_in);
  EXPECT_EQ(zero2["strategy"], "zero2");
  EXPECT_EQ(zero2["world_size"], 2);
  // Each ptrain run carries the memory `ptrain estimate` predicted before it ran, close to what it measured.
  EXPECT_NE(md.find("predicted peak/device"), std::string::npos) << md;  // a CPU bench: per device, not per GPU
  for (const char* id : {"fp32-single-x1", "fp32-ddp-x2", "fp32-dp-x2", "fp32-zero2-x2", "fp32-fsdp-x2"}) {
    std::ifstream record_in(dir / "out" / "runs" / "ptrain" / (std::string(id) + ".json"));
    const auto record = nlohmann::json::parse(record_in);
    ASSERT_TRUE(record["extra"].contains("estimate")) << id << "\n" << r.output;
    const double predicted = record["extra"]["estimate"]["predicted_peak_allocated_bytes"].get<double>();
    const double measured = record["peak_allocated_bytes"].get<double>();
    EXPECT_NEAR(predicted / measured, 1.0, 0.15) << id << ": predicted " << predicted << ", measured " << measured;
  }

  // A second bench with the same --out continues: nothing is run again.
  const Result again = run(bench);
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(count_of(again.output, ": done earlier"), 5u) << again.output;
  EXPECT_EQ(count_of(again.output, "      done: "), 0u) << again.output;
}

// The same runs through PyTorch (the oracle Python's torch), so that one report holds both.
TEST(Cli, BenchWithPytorchPutsBothFrameworksInOneReport) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  const auto dir = scratch("bench_pytorch");
  std::ofstream(dir / "suite.yaml") << kTinySuite;
  const Result r = run("bench --gpus 0 --pytorch --python " + std::string(PTRAIN_ORACLE_PYTHON) + " --source-dir " +
                       PTRAIN_SOURCE_DIR + " --suite " + (dir / "suite.yaml").string() + " --out " + (dir / "out").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count_of(r.output, "      done: "), 7u) << r.output;
  EXPECT_NE(r.output.find("[6/10] pytorch fp32, dp, 2 devices: not run: PyTorch's DataParallel"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[8/10] pytorch fp32, zero2, 2 devices: not run: PyTorch has no ZeRO-2"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[10/10] pytorch fp32, fsdp, 2 devices: not run: PyTorch's FSDP in the reference needs CUDA"),
            std::string::npos) << r.output;
  std::ifstream in(dir / "out" / "runs" / "pytorch" / "fp32-ddp-x2.json");
  ASSERT_TRUE(in.good()) << r.output;
  const auto ddp = nlohmann::json::parse(in);
  EXPECT_EQ(ddp["framework"], "pytorch");
  EXPECT_EQ(ddp["world_size"], 2);
  EXPECT_EQ(ddp["model"], "resnet20");
  EXPECT_EQ(ddp["steps"], 128 / 32) << "each rank takes its half of the epoch";
  std::ifstream md_in(dir / "out" / "report.md");
  const std::string md((std::istreambuf_iterator<char>(md_in)), std::istreambuf_iterator<char>());
  EXPECT_NE(md.find("| pytorch/fp32-ddp-x2 | pytorch |"), std::string::npos) << md;
  EXPECT_NE(md.find("| ptrain/fp32-ddp-x2 | ptrain |"), std::string::npos) << md;
}

// A batch sweep: a run of its own batch-size trains in ptrain and in PyTorch at that batch, each with the
// workload's train-limit scaled so that both batches take the same steps; a bad batch-size or compiled
// variant is one error line naming the suite file and the run, before anything runs.
TEST(Cli, BenchSweepsTheBatchSizeInBothFrameworksKeepingTheSteps) {
  const auto dir = scratch("bench_batch");
  const std::string workload = R"(workload: {model: resnet20, dataset: synthetic, data-path: "256:3x8x8:4", batch-size: 8, train-limit: 32, epochs: 1, threads: 1, test-limit: 16, augment: false}
)";
  std::ofstream(dir / "suite.yaml") << workload << "runs:\n  - {precision: fp32}\n  - {precision: fp32, batch-size: 16}\n";
  const std::string bench = "bench --gpus 0 --no-estimate --pytorch --python " + std::string(PTRAIN_ORACLE_PYTHON) +
                            " --source-dir " + PTRAIN_SOURCE_DIR + " --out " + (dir / "out").string() + " --suite ";
  const Result r = run(bench + (dir / "suite.yaml").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count_of(r.output, "      done: "), 4u) << r.output;
  EXPECT_NE(r.output.find("ptrain fp32, single, 1 device, batch 16"), std::string::npos) << r.output;
  for (const char* framework : {"ptrain", "pytorch"}) {
    for (const auto& [id, batch] : {std::pair<std::string, int>{"fp32-single-x1", 8}, {"fp32-single-x1-b16", 16}}) {
      const auto record = nlohmann::json::parse(std::ifstream(dir / "out" / "runs" / framework / (id + ".json")));
      EXPECT_EQ(record["batch_size_per_device"], batch) << framework << "/" << id;
      EXPECT_EQ(record["steps"], 4) << framework << "/" << id << ": train-limit grows with the batch";
    }
  }
  std::ifstream md_in(dir / "out" / "report.md");
  const std::string md((std::istreambuf_iterator<char>(md_in)), std::istreambuf_iterator<char>());
  EXPECT_NE(md.find("| resnet20 | synthetic, 8 px, batch 8 | fp32 | 1, single | NCHW |"), std::string::npos) << md;
  EXPECT_NE(md.find("| resnet20 | synthetic, 8 px, batch 16 | fp32 | 1, single | NCHW |"), std::string::npos) << md;

  for (const auto& [run_line, expected] :
       {std::pair<std::string, std::string>{"  - {precision: fp32, batch-size: lots}\n",
                                            ": runs[0]: key 'batch-size': 'lots' is not a positive whole number"},
        {"  - {precision: fp32, pytorch: [eager, compiled-fastest]}\n",
         ": runs[0]: key 'pytorch': 'compiled-fastest': 'fastest' is not a torch.compile mode"}}) {
    const fs::path bad = dir / "bad.yaml";
    std::ofstream(bad) << workload << "runs:\n" << run_line;
    const Result refused = run(bench + bad.string());
    EXPECT_EQ(refused.exit_code, 2) << refused.output;
    EXPECT_EQ(refused.output.rfind("ptrain: error: " + bad.string() + expected, 0), 0u) << refused.output;
    EXPECT_EQ(count_of(refused.output, "\n"), 1u) << "one line: " << refused.output;
  }
}

TEST(Cli, BenchKeepsGoingPastAFailingRunAndNamesIt) {
  const auto dir = scratch("bench_fail");
  std::ofstream(dir / "suite.yaml") << R"(workload: {model: resnet20, dataset: synthetic, data-path: "64:3x8x8:4", batch-size: 16, epochs: 1, threads: 1}
runs:
  - {precision: fp16}
  - {precision: fp32}
)";
  const Result r = run("bench --gpus 0 --suite " + (dir / "suite.yaml").string() + " --out " + (dir / "out").string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("FAILED"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ptrain-fp16-single-x1.log"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("      done: "), std::string::npos) << "the fp32 run after the failure must still run\n" << r.output;
  const Result bad = run("bench --gpus 0 --suite nosuchsuite");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.output.find("configs/bench/nosuchsuite.yaml"), std::string::npos) << bad.output;
}

// A stuck or slow run is stopped at --run-timeout with every process of it (ddp's ranks included), and the
// bench goes on; --set shortens the suite's workload, and an --out holding another workload is refused.
TEST(Cli, BenchStopsRunsAtTheirTimeoutAndSetsWorkloadKeys) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  const auto dir = scratch("bench_timeout");
  std::ofstream(dir / "suite.yaml") << R"(workload: {model: resnet20, dataset: synthetic, data-path: "20000:3x32x32:4", batch-size: 16, epochs: 5, threads: 1, test-limit: 32}
runs:
  - {precision: fp32}
  - {precision: fp32, strategy: ddp, devices: 2}
)";
  const std::string suite = " --gpus 0 --no-estimate --suite " + (dir / "suite.yaml").string();
  const auto started = std::chrono::steady_clock::now();
  const Result slow = run("bench" + suite + " --run-timeout 2 --out " + (dir / "slow").string());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_EQ(slow.exit_code, 1) << slow.output;
  EXPECT_EQ(count_of(slow.output, " s (stopped at the --run-timeout of 2 s"), 2u) << slow.output;
  EXPECT_LT(seconds, 60) << "both runs take minutes; the timeout must have stopped them";
  // "[m]" keeps pgrep from finding the shell that runs it.
  const Result left = run_shell("pgrep -f '[m]etrics-out " + (dir / "slow").string() + "' || true");
  EXPECT_EQ(left.output, "") << "processes of the stopped runs outlived them";

  const std::string shortened = " --set max-steps=2 --set data_path=256:3x32x32:4";
  const Result quick = run("bench" + suite + shortened + " --skip ptrain/fp32-ddp-x2 --out " + (dir / "quick").string());
  ASSERT_EQ(quick.exit_code, 0) << quick.output;
  EXPECT_NE(quick.output.find("[2/2] ptrain fp32, ddp, 2 devices: not run: skipped (--skip ptrain/fp32-ddp-x2)"),
            std::string::npos) << quick.output;
  EXPECT_FALSE(fs::exists(dir / "quick" / "runs" / "ptrain" / "fp32-ddp-x2.json"));
  const auto single = nlohmann::json::parse(std::ifstream(dir / "quick" / "runs" / "ptrain" / "fp32-single-x1.json"));
  EXPECT_EQ(single["steps"], 2);
  EXPECT_TRUE(single["steady_images_per_second"].is_null()) << "2 steps are too few for a steady figure";
  const auto record = nlohmann::json::parse(std::ifstream(dir / "quick" / "bench.json"));
  EXPECT_EQ(record["overrides"]["max-steps"], "2");
  EXPECT_EQ(record["workload"]["data-path"], "256:3x32x32:4");

  const Result other = run("bench" + suite + " --set max-steps=3 --out " + (dir / "quick").string());
  EXPECT_EQ(other.exit_code, 2) << other.output;
  EXPECT_NE(other.output.find("holds runs of another workload (data-path 256:3x32x32:4 -> 20000:3x32x32:4; "
                              "max-steps 2 -> 3)"), std::string::npos) << other.output;
  for (const char* bad : {"--set max-stepz=3", "--set max-steps", "--set precision=fp16", "--skip fp32-dp-x2"}) {
    const Result r = run("bench" + suite + " " + bad + " --out " + (dir / "bad").string());
    EXPECT_EQ(r.exit_code, 2) << bad << "\n" << r.output;
  }
  EXPECT_NE(run("bench" + suite + " --set max-stepz=3 --out " + (dir / "bad").string()).output.find("max-stepz"),
            std::string::npos);
}

// The fusions suite on the CPU (its cpu-workloads): each model with every fusion and without the weight casts, the
// records saying which, the report a row each.
TEST(Cli, BenchFusionsSuiteRunsOnTheCpuWithAndWithoutTheWeightCasts) {
  const auto dir = scratch("bench_fusions");
  const Result r = run("bench --gpus 0 --no-estimate --source-dir " + std::string(PTRAIN_SOURCE_DIR) +
                       " --suite fusions --set max-steps=3 --set test-limit=16 --out " + (dir / "out").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* model : {"resnet20", "gpt-tiny"}) {
    const auto runs = dir / "out" / "runs" / "ptrain" / model;
    const auto full = nlohmann::json::parse(std::ifstream(runs / "amp-bf16-single-x1.json"));
    const auto without = nlohmann::json::parse(std::ifstream(runs / "amp-bf16-single-x1-no-weight-casts.json"));
    EXPECT_FALSE(full["kernels"].contains("skipped_fusions")) << model << full["kernels"].dump();
    EXPECT_EQ(without["kernels"]["skipped_fusions"], "weight-casts") << model << without["kernels"].dump();
  }
  std::ifstream csv_in(dir / "out" / "report.csv");
  const std::string csv((std::istreambuf_iterator<char>(csv_in)), std::istreambuf_iterator<char>());
  EXPECT_NE(csv.find("ptrain/resnet20/amp-bf16-single-x1-no-weight-casts,"), std::string::npos) << csv;
  EXPECT_NE(csv.find("ptrain/gpt-tiny/amp-bf16-single-x1-no-weight-casts,"), std::string::npos) << csv;
}

// A suite of two workloads (an image model and a language model) beside PyTorch, cut short by --time-limit
// and continued: records per workload, and the report's side-by-side table of both models.
TEST(Cli, BenchOfSeveralWorkloadsContinuesAfterItsTimeLimitAndComparesEachModel) {
  const auto dir = scratch("bench_several");
  std::ofstream(dir / "suite.yaml") << R"(workloads:
  images: {model: resnet20, dataset: synthetic, data-path: "64:3x8x8:4", batch-size: 8, epochs: 1, threads: 1, test-limit: 16, augment: false}
  tokens: {model: gpt-tiny, dataset: synthetic-tokens, data-path: "64:16:32", batch-size: 8, epochs: 1, threads: 1, test-limit: 8, optimizer: adamw, lr: 1e-3}
runs:
  - {workload: images, precision: fp32}
  - {workload: tokens, precision: fp32}
)";
  const std::string bench = "bench --gpus 0 --no-estimate --pytorch --python " + std::string(PTRAIN_ORACLE_PYTHON) +
                            " --source-dir " + PTRAIN_SOURCE_DIR + " --suite " + (dir / "suite.yaml").string() +
                            " --out " + (dir / "out").string();
  const Result cut = run(bench + " --time-limit 1");
  ASSERT_EQ(cut.exit_code, 0) << cut.output;
  EXPECT_NE(cut.output.find("left for the next bench (--time-limit)"), std::string::npos) << cut.output;
  EXPECT_EQ(cut.output.find("FAILED"), std::string::npos) << cut.output;
  EXPECT_FALSE(fs::exists(dir / "out" / "runs" / "pytorch" / "tokens" / "fp32-single-x1.json")) << cut.output;

  const Result r = run(bench);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("2 runs of 2 workloads on the CPU, each also through PyTorch"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[4/4] pytorch tokens fp32, single, 1 device"), std::string::npos) << r.output;
  for (const char* record : {"ptrain/images", "pytorch/images", "ptrain/tokens", "pytorch/tokens"}) {
    EXPECT_TRUE(fs::is_regular_file(dir / "out" / "runs" / record / "fp32-single-x1.json")) << record << r.output;
  }
  EXPECT_TRUE(fs::is_regular_file(dir / "out" / "workloads" / "tokens.yaml"));
  EXPECT_TRUE(fs::is_regular_file(dir / "out" / "logs" / "tokens" / "pytorch-fp32-single-x1.log"));
  const auto tokens = nlohmann::json::parse(std::ifstream(dir / "out" / "runs" / "ptrain" / "tokens" / "fp32-single-x1.json"));
  EXPECT_EQ(tokens["model"], "gpt-tiny");
  EXPECT_EQ(tokens["seq_len"], 16);
  EXPECT_NEAR(tokens["tokens_per_second"].get<double>(), 16 * tokens["images_per_second"].get<double>(), 1e-6);
  std::ifstream md_in(dir / "out" / "report.md");
  const std::string md((std::istreambuf_iterator<char>(md_in)), std::istreambuf_iterator<char>());
  EXPECT_NE(md.find("## ptrain beside PyTorch"), std::string::npos) << md;
  EXPECT_NE(md.find("| gpt-tiny | synthetic-tokens, 16 tokens, batch 8 | fp32 | 1, single | - |"), std::string::npos) << md;
  EXPECT_NE(md.find("| resnet20 | synthetic, 8 px, batch 8 | fp32 | 1, single | NCHW |"), std::string::npos) << md;
  EXPECT_TRUE(fs::is_regular_file(dir / "out" / "side-by-side.csv"));
  const auto record = nlohmann::json::parse(std::ifstream(dir / "out" / "bench.json"));
  EXPECT_EQ(record["workload"]["tokens/model"], "gpt-tiny");

  const Result other = run(bench + " --set tokens/lr=2e-3");
  EXPECT_EQ(other.exit_code, 2) << other.output;
  EXPECT_NE(other.output.find("holds runs of another workload (tokens/lr 1e-3 -> 2e-3)"), std::string::npos)
      << other.output;
  const Result skipped = run(bench + " --skip pytorch/tokens/fp32-single-x1 --skip images/fp32-single-x1");
  EXPECT_EQ(skipped.exit_code, 0) << skipped.output;
  EXPECT_EQ(count_of(skipped.output, "not run: skipped"), 3u) << skipped.output;
}

// A language model under a sharding strategy that knows nothing of it: gpt-tiny's units gathered one at a time
// by zero3 on two processes, each on half of every batch, end where one process on the whole batch ends.
TEST(Cli, GptUnderZero3OnTwoProcessesMatchesOneProcess) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  const auto dir = scratch("gpt_zero3");
  const std::string gpt =
      "train --model gpt-tiny --dataset synthetic-tokens --data-path 512:16:32 --epochs 1 --optimizer adamw "
      "--lr 0.003 --weight-decay 0.01 --device cpu --progress none --threads 1 --test-limit 64 ";
  const Result one = run(gpt + "--batch-size 16 --metrics-out " + (dir / "one.json").string());
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const int port = ptrain::testing::free_port();
  const Result two = run("launch --nproc-per-node 2 --master-port " + std::to_string(port) + " --timeout 240 -- " +
                         PTRAIN_EXECUTABLE + " " + gpt + "--batch-size 8 --strategy zero3 --dist-timeout 60 " +
                         "--metrics-out " + (dir / "two.json").string());
  ASSERT_EQ(two.exit_code, 0) << two.output;
  const auto a = nlohmann::json::parse(std::ifstream(dir / "one.json"));
  const auto b = nlohmann::json::parse(std::ifstream(dir / "two.json"));
  EXPECT_EQ(b["strategy"], "zero3");
  EXPECT_EQ(b["world_size"], 2);
  EXPECT_EQ(a["steps"], 32);
  EXPECT_EQ(b["steps"], 32);
  const double loss = a["final_test_loss"].get<double>();
  EXPECT_LT(loss, 0.8 * std::log(32.0)) << "gpt-tiny learned little in 32 steps";
  EXPECT_NEAR(b["final_test_loss"].get<double>(), loss, 1e-4 * loss);
  EXPECT_NEAR(b["epochs_detail"][0]["train_loss"].get<double>(), a["epochs_detail"][0]["train_loss"].get<double>(),
              1e-4 * loss);
  // zero3 holds half of the parameters on each rank.
  EXPECT_NEAR(b["model_state_param_bytes"].get<double>() / a["model_state_param_bytes"].get<double>(), 0.5, 0.01);
}

}  // namespace
