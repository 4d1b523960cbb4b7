#include "ptrain/metrics/run_record.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <regex>
#include <set>

#include "ptrain/core/error.h"
#include "ptrain/metrics/gpu_sampler.h"

using namespace ptrain::metrics;
using nlohmann::json;

namespace {

RunRecord sample_record() {
  RunRecord r;
  r.ptrain_version = "0.1.0";
  r.torch_version = "1.13.0";
  r.command_line = "ptrain train --model resnet18 --precision amp-bf16";
  r.model = "resnet18";
  r.dataset = "cifar10";
  r.precision = "amp-bf16";
  r.strategy = "single";
  r.device = "cpu";
  r.world_size = 1;
  r.batch_size_per_device = 128;
  r.global_batch_size = 128;
  r.epochs = 2;
  r.steps = 782;
  r.image_size = 32;
  r.total_wall_seconds = 81.25;
  r.train_wall_seconds = 70.5;
  r.images_per_second = 1418.4397163120568;
  r.peak_allocated_bytes = 123456789012;
  r.gpu_util_peak = 97.0;
  r.host_peak_rss_bytes = 2147483648;
  r.final_test_accuracy = 0.6125;
  r.epochs_detail.push_back({0, 35.0, 1.5, 0.45, 1.2, 0.55, 1428.0, 50000});
  r.epochs_detail.push_back({1, 35.5, 1.1, std::nullopt, std::nullopt, 0.6125, 1408.4, 50000});
  r.environment = {{"gpu_name", "none"}, {"cudnn", nullptr}};
  r.extra = {{"loss_scale", {65536.0, 32768.0}}};
  return r;
}

std::set<std::string> keys_of(const json& object) {
  std::set<std::string> keys;
  for (const auto& item : object.items()) keys.insert(item.key());
  return keys;
}

// Field names in the first column of the tables under the given "## " heading of docs/metrics.md.
std::set<std::string> documented_fields(const std::string& heading) {
  const std::string path = std::string(PTRAIN_SOURCE_DIR) + "/docs/metrics.md";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::set<std::string> fields;
  bool inside = false;
  std::string line;
  const std::regex row(R"(^\|\s*`([a-z0-9_]+)`\s*\|)");
  while (std::getline(in, line)) {
    if (line.rfind("## ", 0) == 0) inside = line == "## " + heading;
    std::smatch m;
    if (inside && std::regex_search(line, m, row)) {
      EXPECT_TRUE(fields.insert(m[1]).second) << "documented twice: " << m[1];
    }
  }
  return fields;
}

std::string make_temp_dir() {
  char tmpl[] = "/tmp/ptrain_run_record_XXXXXX";
  EXPECT_NE(mkdtemp(tmpl), nullptr);
  return tmpl;
}

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (const dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    closedir(d);
  }
  return names;
}

void expect_error_naming(const json& j, const std::string& fragment) {
  try {
    run_record_from_json(j);
    ADD_FAILURE() << "accepted a record with bad '" << fragment << "'";
  } catch (const ptrain::Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(RunRecord, DocumentedFieldsAreExactlyTheWrittenOnes) {
  const json j = to_json(sample_record());
  const auto run_fields = documented_fields("Run record fields");
  const auto epoch_fields = documented_fields("Epoch fields");
  EXPECT_GT(run_fields.size(), 20u);
  EXPECT_EQ(keys_of(j), run_fields);
  EXPECT_EQ(keys_of(j["epochs_detail"][0]), epoch_fields);
}

TEST(RunRecord, UnitsAreInTheNames) {
  const json j = to_json(sample_record());
  EXPECT_EQ(j["schema_version"], 1);
  for (const std::string key : {"total_wall_seconds", "train_wall_seconds", "images_per_second",
                                "peak_allocated_bytes", "peak_reserved_bytes", "peak_nvml_used_bytes",
                                "host_peak_rss_bytes"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
}

TEST(RunRecord, JsonRoundTrip) {
  const RunRecord original = sample_record();
  const json written = to_json(original);
  const RunRecord read = run_record_from_json(json::parse(written.dump()));
  EXPECT_EQ(to_json(read), written);
  EXPECT_EQ(read.command_line, original.command_line);
  EXPECT_EQ(read.peak_allocated_bytes, 123456789012);
  EXPECT_FALSE(read.peak_reserved_bytes);
  EXPECT_EQ(read.gpu_util_peak, 97.0);
  EXPECT_FALSE(read.gpu_util_mean);
  ASSERT_EQ(read.epochs_detail.size(), 2u);
  EXPECT_EQ(read.epochs_detail[0].train_accuracy, 0.45);
  EXPECT_FALSE(read.epochs_detail[1].test_loss);
  EXPECT_EQ(read.epochs_detail[1].images, 50000);
  EXPECT_EQ(read.extra["loss_scale"][1], 32768.0);
}

TEST(RunRecord, UnmeasuredValuesAreNullNotZero) {
  // What a run on a machine without NVML and without CUDA produces.
  Nvml missing("/nonexistent/libnvidia-ml.so.1");
  GpuSampler sampler({0}, std::chrono::milliseconds(5), missing);
  sampler.start();
  sampler.stop();
  const auto stats = sampler.stats();
  RunRecord r = sample_record();
  r.peak_allocated_bytes.reset();
  r.gpu_util_mean = stats.util_mean;
  r.gpu_util_peak = stats.util_peak;
  if (stats.memory_used_peak) r.peak_nvml_used_bytes = static_cast<int64_t>(*stats.memory_used_peak);
  r.final_test_loss.reset();
  const json j = to_json(r);
  for (const std::string key : {"peak_allocated_bytes", "peak_reserved_bytes", "peak_nvml_used_bytes",
                                "gpu_util_mean", "gpu_util_peak", "final_test_loss"}) {
    EXPECT_TRUE(j[key].is_null()) << key << " = " << j[key];
  }
  EXPECT_TRUE(j["epochs_detail"][1]["train_accuracy"].is_null());
}

TEST(RunRecord, NonFiniteNumbersAreWrittenAsNullAndReadAsNaN) {
  RunRecord r = sample_record();
  r.epochs_detail[1].train_loss = std::nan("");
  r.final_test_loss = INFINITY;
  const json j = to_json(r);
  EXPECT_TRUE(j["epochs_detail"][1]["train_loss"].is_null());
  EXPECT_TRUE(j["final_test_loss"].is_null());
  const RunRecord read = run_record_from_json(j);
  EXPECT_TRUE(std::isnan(read.epochs_detail[1].train_loss));
  EXPECT_FALSE(read.final_test_loss);
}

TEST(RunRecord, BadJsonIsRefusedNamingTheKey) {
  const json good = to_json(sample_record());
  json j = good;
  j.erase("global_batch_size");
  expect_error_naming(j, "global_batch_size");
  j = good;
  j["steps"] = "782";
  expect_error_naming(j, "steps");
  j = good;
  j["world_size"] = 1.5;
  expect_error_naming(j, "world_size");
  j = good;
  j["schema_version"] = 2;
  expect_error_naming(j, "schema_version");
  j = good;
  j.erase("schema_version");
  expect_error_naming(j, "schema_version");
  j = good;
  j["epochs_detail"][1].erase("images");
  expect_error_naming(j, "epochs_detail[1]");
  j = good;
  j["gpu_util_mean"] = "high";
  expect_error_naming(j, "gpu_util_mean");
  j = good;
  j["environment"] = json::array();
  expect_error_naming(j, "environment");
  expect_error_naming(json::array(), "object");
}

TEST(RunRecord, AtomicWriteLeavesOnlyTheRecord) {
  const std::string dir = make_temp_dir();
  const std::string path = dir + "/run.json";
  RunRecord r = sample_record();
  write_run_record(path, r);
  r.steps = 1000;
  write_run_record(path, r);  // replaces
  EXPECT_EQ(list_dir(dir), std::vector<std::string>{"run.json"});
  std::ifstream in(path);
  const RunRecord read = run_record_from_json(json::parse(in));
  EXPECT_EQ(read.steps, 1000);
  std::remove(path.c_str());
  rmdir(dir.c_str());
}

TEST(RunRecord, UnwritablePathIsAnErrorAndLeavesNoTempFile) {
  const std::string dir = make_temp_dir();
  const std::string target = dir + "/existing_directory";
  ASSERT_EQ(mkdir(target.c_str(), 0755), 0);
  // rename() cannot replace a directory by a file: the write itself succeeds, the rename fails.
  try {
    write_run_record(target, sample_record());
    ADD_FAILURE() << "wrote over a directory";
  } catch (const ptrain::Error& e) {
    EXPECT_NE(std::string(e.what()).find(target), std::string::npos) << e.what();
  }
  EXPECT_EQ(list_dir(dir), std::vector<std::string>{"existing_directory"});
  EXPECT_THROW(write_run_record(dir + "/missing/run.json", sample_record()), ptrain::Error);
  rmdir(target.c_str());
  rmdir(dir.c_str());
}
