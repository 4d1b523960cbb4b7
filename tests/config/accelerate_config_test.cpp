#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "ptrain/config/accelerate_config.h"
#include "ptrain/config/cli_options.h"
#include "ptrain/config/settings_in_effect.h"
#include "ptrain/core/error.h"
#include "test_support.h"

namespace {

namespace fs = std::filesystem;
using ptrain::config::read_accelerate_config;

std::string repo_file(const std::string& relative) { return std::string(PTRAIN_SOURCE_DIR) + "/" + relative; }

std::string write_yaml(const std::string& name, const std::string& text) {
  const fs::path path = fs::temp_directory_path() / ("ptrain_accelerate_test_" + name + ".yaml");
  std::ofstream(path) << text;
  return path.string();
}

std::string error_of(const std::string& path) {
  return ptrain::testing::error_message<ptrain::Error>([&] { read_accelerate_config(path); });
}

const std::string kBase =
    "compute_environment: LOCAL_MACHINE\nmachine_rank: 0\nnum_machines: 1\nrdzv_backend: static\n";

TEST(AccelerateConfig, TheMultiGpuFileAccelerateWritesReadsUnchanged) {
  const auto path = repo_file("configs/accelerate/multi-gpu-4.yaml");
  const auto launch = read_accelerate_config(path);
  EXPECT_EQ(launch.num_processes_per_machine, 4);
  EXPECT_EQ(launch.num_machines, 1);
  EXPECT_EQ(launch.machine_rank, 0);
  EXPECT_EQ(launch.environment.at("PTRAIN_STRATEGY"), "ddp");
  EXPECT_EQ(launch.environment.count("PTRAIN_DEVICE"), 0u);
  EXPECT_EQ(launch.environment.count("PTRAIN_PRECISION"), 0u);
  EXPECT_EQ(launch.environment.count("CUDA_VISIBLE_DEVICES"), 0u);  // gpu_ids: all
  // main_training_function and same_network, which accelerate writes into every file, change nothing here.
  EXPECT_TRUE(launch.warnings.empty()) << launch.warnings.front();
}

// tests/config/fixtures/accelerate_multi_cpu.yaml is a MULTI_CPU file as `accelerate config` (1.x) writes it,
// verbatim: ipex_config and mpirun_config were refused, main_training_function and same_network warned on every
// launch. It reads without a word and becomes two processes of ddp on the CPU (gloo: --backend unset on the CPU).
TEST(AccelerateConfig, TheMultiCpuFileAccelerateWritesRunsAsIsWithoutWarnings) {
  const std::string path = repo_file("tests/config/fixtures/accelerate_multi_cpu.yaml");
  const auto launch = read_accelerate_config(path);
  EXPECT_EQ(launch.num_processes_per_machine, 2);
  EXPECT_EQ(launch.num_machines, 1);
  EXPECT_EQ(launch.main_process_ip, "127.0.0.1");
  EXPECT_EQ(launch.main_process_port, 29500);
  std::string warnings;
  for (const auto& w : launch.warnings) warnings += w + "\n";
  EXPECT_TRUE(launch.warnings.empty()) << warnings;

  // What the started `ptrain train` processes make of the environment: ddp on the CPU, fp32, gloo.
  for (const auto& [name, value] : launch.environment) ::setenv(name.c_str(), value.c_str(), 1);
  ptrain::config::TrainConfig c;
  CLI::App app;
  ptrain::config::add_train_options(app, c);
  const char* argv[] = {"train"};
  app.parse(1, const_cast<char**>(argv));
  for (const auto& [name, value] : launch.environment) ::unsetenv(name.c_str());
  EXPECT_EQ(c.run.strategy, "ddp");
  EXPECT_EQ(c.run.device, "cpu");
  EXPECT_EQ(c.precision.precision, "fp32");
  EXPECT_EQ(c.dist.backend, "");  // strategies/factory.cpp: gloo on the CPU
  EXPECT_NO_THROW(ptrain::config::refuse_settings_without_effect(c));
}

// What accelerate's ipex_config and mpirun_config ask that ptrain cannot do is named with the file and the key:
// IPEX (a speed-up accelerate itself goes without where IPEX is missing) in a warning, an mpirun hostfile (the
// processes spread over other hosts) as an error.
TEST(AccelerateConfig, IpexAndMpirunSettingsPtrainCannotHonourAreNamed) {
  const std::string cpu = kBase + "distributed_type: MULTI_CPU\nnum_processes: 2\n";
  const auto ipex = write_yaml("ipex", cpu + "ipex_config:\n  ipex: true\n");
  const auto with_ipex = read_accelerate_config(ipex);
  ASSERT_EQ(with_ipex.warnings.size(), 1u);
  EXPECT_NE(with_ipex.warnings[0].find(ipex + ": key 'ipex_config.ipex' is true: ptrain does not use Intel Extension"),
            std::string::npos) << with_ipex.warnings[0];

  const auto hostfile = write_yaml("hostfile", cpu + "mpirun_config:\n  mpirun_ccl: '1'\n"
                                                     "  mpirun_hostfile: /home/me/hostfile\n");
  const std::string message = error_of(hostfile);
  EXPECT_NE(message.find(hostfile + ": key 'mpirun_config.mpirun_hostfile' is '/home/me/hostfile'"), std::string::npos)
      << message;
  EXPECT_NE(message.find("run ptrain launch on every machine"), std::string::npos) << message;

  const auto ccl = read_accelerate_config(write_yaml("ccl", cpu + "mpirun_config:\n  mpirun_ccl: 4\n"));
  ASSERT_EQ(ccl.warnings.size(), 1u);
  EXPECT_NE(ccl.warnings[0].find("key 'mpirun_config.mpirun_ccl' is 4"), std::string::npos) << ccl.warnings[0];
  const auto empty = read_accelerate_config(write_yaml("mpirun_empty", cpu + "mpirun_config: {}\nipex_config: {}\n"));
  EXPECT_TRUE(empty.warnings.empty());

  for (const auto& [file, key] : std::vector<std::pair<std::string, std::string>>{
           {cpu + "ipex_config:\n  ipex: false\n  ipex_level: O1\n", "ipex_config.ipex_level"},
           {cpu + "mpirun_config:\n  mpirun_hosts: a,b\n", "mpirun_config.mpirun_hosts"},
           {cpu + "ipex_config:\n  ipex: maybe\n", "ipex_config.ipex"},
           {cpu + "ipex_config: true\n", "ipex_config"}}) {
    const std::string unknown = error_of(write_yaml("ipex_mpirun_keys", file));
    EXPECT_NE(unknown.find("key '" + key + "'"), std::string::npos) << unknown;
  }
}

// yaml-cpp's as<int> read 010 as octal eight: accelerate's integers are decimal as ptrain's flags are.
TEST(AccelerateConfig, ZeroPaddedIntegersAreDecimalAndOtherBasesAreRefused) {
  const auto padded = write_yaml("zero_padded", kBase + "distributed_type: MULTI_CPU\nnum_processes: 010\n");
  EXPECT_EQ(read_accelerate_config(padded).num_processes_per_machine, 10);
  const auto nine = write_yaml("nine", kBase + "distributed_type: MULTI_CPU\nnum_processes: 09\n");
  EXPECT_EQ(read_accelerate_config(nine).num_processes_per_machine, 9);
  const auto hex = write_yaml("hex", kBase + "distributed_type: MULTI_CPU\nnum_processes: 0x10\n");
  const std::string message = error_of(hex);
  EXPECT_NE(message.find(hex + ": key 'num_processes': '0x10' is not a decimal number"), std::string::npos) << message;
}

// yaml-cpp keeps both entries of a key given twice: the second num_processes won without a word.
TEST(AccelerateConfig, AKeyGivenTwiceIsRefusedNamingTheFileTheKeyAndBothLines) {
  const auto top = write_yaml("twice", kBase + "distributed_type: MULTI_CPU\nnum_processes: 2\nnum_processes: 4\n");
  EXPECT_EQ(error_of(top), top + ": key 'num_processes' is given twice (lines 6 and 7): keep one");
  const auto nested = write_yaml("twice_nested", kBase + "distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n"
                                                         "  fsdp_offload_params: false\n  fsdp_offload_params: true\n");
  EXPECT_NE(error_of(nested).find(nested + ": key 'fsdp_config.fsdp_offload_params' is given twice"), std::string::npos)
      << error_of(nested);
}

TEST(AccelerateConfig, MultiCpuMixedPrecisionAndGpuIds) {
  const auto cpu = read_accelerate_config(repo_file("configs/accelerate/multi-cpu-2.yaml"));
  EXPECT_EQ(cpu.num_processes_per_machine, 2);
  EXPECT_EQ(cpu.environment.at("PTRAIN_DEVICE"), "cpu");
  EXPECT_EQ(cpu.environment.at("PTRAIN_PRECISION"), "amp-bf16");

  const auto path = write_yaml("gpus",
                               "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_processes: 2\n"
                               "gpu_ids: [0, 2]\nmixed_precision: fp16\nnum_machines: 2\nmachine_rank: 1\n"
                               "main_process_ip: 10.1.2.3\nmain_process_port: 4242\n");
  const auto launch = read_accelerate_config(path);
  EXPECT_EQ(launch.environment.at("CUDA_VISIBLE_DEVICES"), "0,2");
  EXPECT_EQ(launch.environment.at("PTRAIN_PRECISION"), "amp-fp16");
  EXPECT_EQ(launch.num_machines, 2);
  EXPECT_EQ(launch.num_processes_per_machine, 1);
  EXPECT_EQ(launch.machine_rank, 1);
  EXPECT_EQ(launch.main_process_ip, "10.1.2.3");
  EXPECT_EQ(launch.main_process_port, 4242);
}

TEST(AccelerateConfig, UnsupportedSettingsAreNamed) {
  const auto megatron = write_yaml("megatron", kBase + "distributed_type: MEGATRON_LM\nnum_processes: 2\n");
  EXPECT_NE(error_of(megatron).find("'distributed_type'"), std::string::npos);
  const auto misplaced = write_yaml("misplaced", kBase + "distributed_type: MULTI_GPU\nfsdp_config:\n  fsdp_version: 1\n");
  EXPECT_NE(error_of(misplaced).find("'fsdp_config'"), std::string::npos);
  const auto unknown = write_yaml("unknown", kBase + "distributed_type: MULTI_GPU\nmegatron_lm_config: {}\n");
  EXPECT_NE(error_of(unknown).find("'megatron_lm_config'"), std::string::npos);
  const auto tpu = write_yaml("tpu", kBase + "tpu_use_cluster: true\n");
  EXPECT_NE(error_of(tpu).find("TPU"), std::string::npos);
  // (kBase's num_machines: 1 given again would be a key given twice.)
  const auto uneven = write_yaml("uneven", "compute_environment: LOCAL_MACHINE\nmachine_rank: 0\nrdzv_backend: static\n"
                                           "distributed_type: MULTI_GPU\nnum_processes: 3\nnum_machines: 2\n");
  EXPECT_NE(error_of(uneven).find("not divisible"), std::string::npos);
  const auto precision = write_yaml("fp4", kBase + "mixed_precision: fp4\n");
  const std::string message = error_of(precision);
  EXPECT_NE(message.find("'mixed_precision'"), std::string::npos) << message;
  EXPECT_NE(message.find(precision), std::string::npos) << message;
  EXPECT_NE(error_of("/nonexistent/accelerate.yaml").find("/nonexistent/accelerate.yaml"), std::string::npos);
}

}  // namespace

namespace {

std::string env_of(const ptrain::config::AccelerateLaunch& launch, const std::string& name) {
  const auto it = launch.environment.find(name);
  return it == launch.environment.end() ? "<unset>" : it->second;
}

TEST(AccelerateConfig, Fp8IsThePrecisionModeFp8) {
  const auto launch = read_accelerate_config(write_yaml("fp8", kBase + "distributed_type: MULTI_GPU\nnum_processes: 2\n"
                                                                        "mixed_precision: fp8\n"));
  EXPECT_EQ(env_of(launch, "PTRAIN_PRECISION"), "fp8");
  EXPECT_EQ(env_of(launch, "PTRAIN_STRATEGY"), "ddp");
  const auto deepspeed = write_yaml("fp8-ds", kBase + "distributed_type: DEEPSPEED\nmixed_precision: fp8\n");
  const std::string message = error_of(deepspeed);
  EXPECT_NE(message.find("'mixed_precision'"), std::string::npos) << message;
  EXPECT_NE(message.find("Transformer Engine"), std::string::npos) << message;
}

// fp8_config as `accelerate config` writes it: Transformer Engine's backend is delayed scaling, torchao's dynamic;
// what ptrain does otherwise than the file asks is a warning naming the key; MS-AMP and unknown keys are errors.
TEST(AccelerateConfig, Fp8ConfigsBackendChoosesTheScaling) {
  const std::string fp8 = kBase + "distributed_type: MULTI_GPU\nnum_processes: 2\nmixed_precision: fp8\n";
  const auto te = read_accelerate_config(write_yaml(
      "fp8-te", fp8 + "fp8_config:\n  amax_compute_algo: max\n  amax_history_len: 1024\n  backend: TE\n"
                      "  fp8_format: HYBRID\n  interval: 1\n  margin: 0\n"
                      "  override_linear_precision: (false, false, false)\n  use_autocast_during_eval: false\n"));
  EXPECT_EQ(env_of(te, "PTRAIN_PRECISION"), "fp8");
  EXPECT_EQ(env_of(te, "PTRAIN_FP8_SCALING"), "delayed");
  ASSERT_EQ(te.warnings.size(), 2u);  // the history of 1024 and evaluation without FP8; the rest is ptrain's
  EXPECT_NE(te.warnings[0].find("fp8_config.amax_history_len' is 1024: ptrain keeps the amax of the last 16"),
            std::string::npos)
      << te.warnings[0];
  EXPECT_NE(te.warnings[1].find("fp8_config.use_autocast_during_eval"), std::string::npos) << te.warnings[1];

  const auto ao = read_accelerate_config(write_yaml("fp8-ao", fp8 + "fp8_config:\n  backend: AO\n"));
  EXPECT_EQ(env_of(ao, "PTRAIN_FP8_SCALING"), "dynamic");
  EXPECT_TRUE(ao.warnings.empty());
  const auto e4m3 = read_accelerate_config(write_yaml("fp8-e4m3", fp8 + "fp8_config:\n  backend: TE\n  fp8_format: E4M3\n"));
  ASSERT_EQ(e4m3.warnings.size(), 1u);
  EXPECT_NE(e4m3.warnings[0].find("gradients to E5M2"), std::string::npos) << e4m3.warnings[0];

  const std::string msamp = error_of(write_yaml("fp8-msamp", fp8 + "fp8_config:\n  backend: MSAMP\n  opt_level: O2\n"));
  EXPECT_NE(msamp.find("key 'fp8_config.backend'"), std::string::npos) << msamp;
  EXPECT_NE(msamp.find("MS-AMP"), std::string::npos) << msamp;
  const std::string unknown = error_of(write_yaml("fp8-unknown", fp8 + "fp8_config:\n  backend: TE\n  amax_histroy: 4\n"));
  EXPECT_NE(unknown.find("key 'fp8_config.amax_histroy' is not an fp8_config setting ptrain knows"), std::string::npos)
      << unknown;
  const auto bf16 = read_accelerate_config(write_yaml(
      "fp8-unused", kBase + "distributed_type: MULTI_GPU\nnum_processes: 2\nmixed_precision: bf16\nfp8_config:\n"
                            "  backend: TE\n"));
  EXPECT_EQ(env_of(bf16, "PTRAIN_FP8_SCALING"), "<unset>");
  ASSERT_EQ(bf16.warnings.size(), 1u);
  EXPECT_NE(bf16.warnings[0].find("'fp8_config' has no effect: mixed_precision is bf16"), std::string::npos)
      << bf16.warnings[0];
}

TEST(AccelerateConfig, TheIssuesFsdpFileReadsUnchanged) {
  // configs/accelerate/fsdp-4.yaml is the file of issue 4, verbatim.
  const auto launch = read_accelerate_config(repo_file("configs/accelerate/fsdp-4.yaml"));
  EXPECT_EQ(launch.num_processes_per_machine, 4);
  EXPECT_EQ(env_of(launch, "PTRAIN_STRATEGY"), "fsdp");
  EXPECT_EQ(env_of(launch, "PTRAIN_FSDP_SHARDING"), "full-shard");  // fsdp_sharding_strategy: 1
  EXPECT_EQ(env_of(launch, "PTRAIN_AUTO_WRAP"), "size");
  EXPECT_EQ(env_of(launch, "PTRAIN_MIN_NUM_PARAMS"), "1000000");
  EXPECT_EQ(env_of(launch, "PTRAIN_BACKWARD_PREFETCH"), "pre");
  EXPECT_EQ(env_of(launch, "PTRAIN_FORWARD_PREFETCH"), "true");
  EXPECT_EQ(env_of(launch, "PTRAIN_OFFLOAD_PARAMS"), "false");
  EXPECT_EQ(env_of(launch, "PTRAIN_SYNC_MODULE_STATES"), "true");
  EXPECT_EQ(env_of(launch, "PTRAIN_STATE_DICT"), "sharded");
  EXPECT_EQ(env_of(launch, "PTRAIN_PRECISION"), "<unset>");  // mixed_precision: 'no'
  bool orig_params_named = false;
  for (const auto& w : launch.warnings) orig_params_named |= w.find("fsdp_use_orig_params") != std::string::npos;
  EXPECT_TRUE(orig_params_named);
}

TEST(AccelerateConfig, FsdpReachesTheTrainConfigThroughTheEnvironment) {
  const auto launch = read_accelerate_config(repo_file("configs/accelerate/fsdp-4.yaml"));
  for (const auto& [name, value] : launch.environment) ::setenv(name.c_str(), value.c_str(), 1);
  ptrain::config::TrainConfig c;
  CLI::App app;
  ptrain::config::add_train_options(app, c);
  const char* argv[] = {"train"};
  app.parse(1, const_cast<char**>(argv));
  for (const auto& [name, value] : launch.environment) ::unsetenv(name.c_str());
  EXPECT_EQ(c.run.strategy, "fsdp");
  EXPECT_EQ(c.sharding.fsdp_sharding, "full-shard");
  EXPECT_EQ(c.sharding.auto_wrap, "size");
  EXPECT_EQ(c.sharding.min_num_params, 1000000);
  EXPECT_EQ(c.sharding.backward_prefetch, "pre");
  EXPECT_TRUE(c.sharding.forward_prefetch);
  EXPECT_TRUE(c.sharding.sync_module_states);
  EXPECT_EQ(c.sharding.state_dict, "sharded");
}

TEST(AccelerateConfig, FsdpSpellingsAndNumbers) {
  const auto fsdp = [](const std::string& keys) {
    return write_yaml("fsdp_keys", kBase + "distributed_type: FSDP\nnum_processes: 2\nmixed_precision: bf16\n"
                                           "fsdp_config:\n" + keys);
  };
  const auto launch = read_accelerate_config(fsdp(
      "  fsdp_backward_prefetch: BACKWARD_POST\n  fsdp_sharding_strategy: SHARD_GRAD_OP\n"
      "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  fsdp_transformer_layer_cls_to_wrap: Bottleneck, BasicBlock\n"
      "  fsdp_state_dict_type: FULL_STATE_DICT\n  fsdp_activation_checkpointing: true\n  fsdp_version: 1\n"));
  EXPECT_EQ(env_of(launch, "PTRAIN_BACKWARD_PREFETCH"), "post");
  EXPECT_EQ(env_of(launch, "PTRAIN_FSDP_SHARDING"), "shard-grad-op");
  EXPECT_EQ(env_of(launch, "PTRAIN_AUTO_WRAP"), "type");
  EXPECT_EQ(env_of(launch, "PTRAIN_WRAP_TYPES"), "Bottleneck,BasicBlock");
  EXPECT_EQ(env_of(launch, "PTRAIN_STATE_DICT"), "full");
  EXPECT_EQ(env_of(launch, "PTRAIN_ACTIVATION_CHECKPOINTING"), "true");
  EXPECT_EQ(env_of(launch, "PTRAIN_PRECISION"), "amp-bf16");
  EXPECT_EQ(env_of(launch, "PTRAIN_PARAM_DTYPE"), "bf16");
  EXPECT_EQ(env_of(launch, "PTRAIN_REDUCE_DTYPE"), "bf16");
  for (const auto& [number, name] : std::vector<std::pair<std::string, std::string>>{
           {"1", "full-shard"}, {"2", "shard-grad-op"}, {"3", "no-shard"}, {"4", "hybrid-shard"},
           {"5", "hybrid-shard-zero2"}, {"_HYBRID_SHARD_ZERO2", "hybrid-shard-zero2"}}) {
    EXPECT_EQ(env_of(read_accelerate_config(fsdp("  fsdp_sharding_strategy: " + number + "\n")), "PTRAIN_FSDP_SHARDING"),
              name);
  }
  EXPECT_NE(error_of(fsdp("  fsdp_sharding_strategy: 6\n")).find("fsdp_sharding_strategy"), std::string::npos);
  EXPECT_NE(error_of(fsdp("  fsdp_state_dict_type: LOCAL_STATE_DICT\n")).find("LOCAL_STATE_DICT"), std::string::npos);
  EXPECT_NE(error_of(fsdp("  fsdp_backward_prefetch: BACKWARD_PRE\n  fsdp_backward_prefetch_policy: BACKWARD_POST\n"))
                .find("disagree"),
            std::string::npos);
  EXPECT_NE(error_of(fsdp("  fsdp_wrap_everything: true\n")).find("fsdp_config.fsdp_wrap_everything"),
            std::string::npos);
}

TEST(AccelerateConfig, DeepSpeedMapsToZeroStages) {
  const auto launch = read_accelerate_config(repo_file("configs/accelerate/deepspeed-zero2-2.yaml"));
  EXPECT_EQ(launch.num_processes_per_machine, 2);
  EXPECT_EQ(env_of(launch, "PTRAIN_STRATEGY"), "zero2");
  EXPECT_EQ(env_of(launch, "PTRAIN_OFFLOAD_OPTIMIZER"), "true");
  EXPECT_EQ(env_of(launch, "PTRAIN_GRAD_ACCUM"), "2");
  EXPECT_EQ(env_of(launch, "PTRAIN_CLIP_GRAD_NORM"), "1.0");
  EXPECT_EQ(env_of(launch, "PTRAIN_PRECISION"), "bf16");  // DeepSpeed: a bf16 model, fp32 master weights
  EXPECT_EQ(env_of(launch, "PTRAIN_MASTER_WEIGHTS"), "true");

  const auto ds = [](const std::string& keys) {
    return write_yaml("ds_keys", kBase + "distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n" + keys);
  };
  for (int stage = 0; stage <= 3; ++stage) {
    const char* expected[] = {"ddp", "zero1", "zero2", "zero3"};
    EXPECT_EQ(env_of(read_accelerate_config(ds("  zero_stage: " + std::to_string(stage) + "\n")), "PTRAIN_STRATEGY"),
              expected[stage]);
  }
  const auto zero3 = read_accelerate_config(ds("  zero_stage: 3\n  offload_param_device: cpu\n  zero3_init_flag: true\n"));
  EXPECT_EQ(env_of(zero3, "PTRAIN_OFFLOAD_PARAMS"), "true");
  EXPECT_FALSE(zero3.warnings.empty());  // zero3_init_flag is named
  const auto file = read_accelerate_config(ds("  deepspeed_config_file: /tmp/ds_config.json\n"));
  EXPECT_EQ(env_of(file, "PTRAIN_DEEPSPEED_CONFIG"), "/tmp/ds_config.json");
  EXPECT_EQ(env_of(file, "PTRAIN_STRATEGY"), "<unset>");  // the file says
  EXPECT_NE(error_of(ds("  zero_stage: 2\n  offload_param_device: cpu\n")).find("zero_stage 3"), std::string::npos);
  EXPECT_NE(error_of(ds("  offload_optimizer_device: nvme\n")).find("nvme"), std::string::npos);
  EXPECT_NE(error_of(ds("  deepspeed_moe_layer_cls_names: Expert\n")).find("deepspeed_moe_layer_cls_names"),
            std::string::npos);
}

}  // namespace
