#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "ptrain/config/accelerate_config.h"
#include "ptrain/core/error.h"
#include "test_support.h"  // tests/io

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
  ASSERT_EQ(launch.warnings.size(), 2u);  // main_training_function and same_network are named, not dropped
  EXPECT_NE(launch.warnings[0].find("main_training_function"), std::string::npos);
  EXPECT_NE(launch.warnings[1].find("same_network"), std::string::npos);
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
  const auto fsdp = write_yaml("fsdp", kBase + "distributed_type: FSDP\nnum_processes: 2\n");
  EXPECT_NE(error_of(fsdp).find("'distributed_type'"), std::string::npos);
  const auto unknown = write_yaml("unknown", kBase + "distributed_type: MULTI_GPU\nfsdp_config: {}\n");
  EXPECT_NE(error_of(unknown).find("'fsdp_config'"), std::string::npos);
  const auto tpu = write_yaml("tpu", kBase + "tpu_use_cluster: true\n");
  EXPECT_NE(error_of(tpu).find("TPU"), std::string::npos);
  const auto uneven = write_yaml("uneven", kBase + "distributed_type: MULTI_GPU\nnum_processes: 3\nnum_machines: 2\n");
  EXPECT_NE(error_of(uneven).find("not divisible"), std::string::npos);
  const auto precision = write_yaml("fp8", kBase + "mixed_precision: fp8\n");
  const std::string message = error_of(precision);
  EXPECT_NE(message.find("'mixed_precision'"), std::string::npos) << message;
  EXPECT_NE(message.find(precision), std::string::npos) << message;
  EXPECT_NE(error_of("/nonexistent/accelerate.yaml").find("/nonexistent/accelerate.yaml"), std::string::npos);
}

}  // namespace
