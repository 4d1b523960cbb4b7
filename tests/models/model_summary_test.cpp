#include "ptrain/models/model_summary.h"

#include <gtest/gtest.h>

#include <sstream>

#include "ptrain/models/zoo.h"
#include "test_support.h"

namespace {

using ptrain::models::summarize_model;
using ptrain::testing::run_oracle;

// ptrain's resnet18 (torchvision's architecture at 224 pixels) against torchvision's own count:
// 11,689,512 parameters for 1000 classes, module by module.
TEST(ModelSummary, CountsResNet18AsTorchvisionDoes) {
  const auto oracle = run_oracle("model_summary.py", "resnet18 1000");
  ASSERT_EQ(oracle.exit_code, 0) << oracle.output;
  std::istringstream lines(oracle.output);
  std::string word;
  int64_t total = 0, trainable = 0, buffers = 0;
  lines >> word >> total >> trainable >> buffers;
  ASSERT_EQ(word, "total") << oracle.output;
  EXPECT_EQ(total, 11689512);  // the figure torchvision's documentation gives

  auto model = ptrain::models::make_model({"resnet18", 1000, 3, 224});
  auto summary = summarize_model(*model);
  EXPECT_EQ(summary.parameters, total);
  EXPECT_EQ(summary.trainable, trainable);
  EXPECT_EQ(summary.buffers, buffers);
  EXPECT_EQ(summary.parameter_bytes, total * 4);
  ASSERT_EQ(summary.dtypes.size(), 1u);
  EXPECT_EQ(summary.dtypes[0].first, "float32");
  EXPECT_EQ(summary.dtypes[0].second, total);
  std::string name;
  int64_t count = 0;
  size_t i = 0;
  while (lines >> name >> count) {
    ASSERT_LT(i, summary.parts.size()) << name;
    EXPECT_EQ(summary.parts[i].name, name);
    EXPECT_EQ(summary.parts[i].parameters, count) << name;
    ++i;
  }
  EXPECT_EQ(i, summary.parts.size());

  const std::string text = ptrain::models::describe_model_summary(summary);
  EXPECT_EQ(text.rfind("11,689,512 parameters (11,689,512 trainable, float32, 44.6 MiB)", 0), 0u) << text;
  EXPECT_NE(text.find("\n  fc           513,000"), std::string::npos) << text;

  // Frozen parameters and a half-precision model show as such.
  model->named_parameters()["fc.weight"].set_requires_grad(false);
  model->to(torch::kBFloat16);
  summary = summarize_model(*model);
  EXPECT_EQ(summary.trainable, total - 512000);
  EXPECT_EQ(summary.parameter_bytes, total * 2);
  EXPECT_EQ(summary.dtypes[0].first, "bfloat16");
  EXPECT_NE(ptrain::models::describe_model_summary(summary).find("fc           513,000 (1,000 trainable)"),
            std::string::npos)
      << ptrain::models::describe_model_summary(summary);
}

TEST(ModelSummary, WritesCountsAndBytesForPeople) {
  EXPECT_EQ(ptrain::models::with_commas(0), "0");
  EXPECT_EQ(ptrain::models::with_commas(999), "999");
  EXPECT_EQ(ptrain::models::with_commas(1000), "1,000");
  EXPECT_EQ(ptrain::models::with_commas(11689512), "11,689,512");
  EXPECT_EQ(ptrain::models::byte_text(512), "512 B");
  EXPECT_EQ(ptrain::models::byte_text(1536), "1.5 KiB");
  EXPECT_EQ(ptrain::models::byte_text(int64_t{3} << 30), "3.0 GiB");
}

}  // namespace
