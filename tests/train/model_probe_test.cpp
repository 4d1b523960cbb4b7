// A TorchScript model is run before training as the run runs it (train mode, and eval mode without
// gradients, under the run's autocast): one that cannot evaluate is refused before its first step, one
// that can trains as before, and the probe leaves no trace in the model's buffers or the random stream.
#include <gtest/gtest.h>

#include <filesystem>

#include "ptrain/core/error.h"
#include "ptrain/models/torchscript_model.h"
#include "ptrain/precision/policy.h"
#include "ptrain/train/model_probe.h"
#include "ptrain/train/plan.h"
#include "ptrain/train/trainer.h"
#include "test_support.h"

namespace ptrain::train {
namespace {

std::string fixture(const std::string& name) { return std::string(PTRAIN_TORCHSCRIPT_FIXTURES) + "/" + name; }

config::TrainConfig vit_run(const std::string& precision, const std::string& checkpoint_dir) {
  config::TrainConfig c;
  c.model.name = fixture("vit.pt");
  c.data.dataset = "imagefolder";
  c.data.path = fixture("data");
  c.data.augment = false;
  c.data.loader_threads = 1;
  c.data.test_limit = 8;
  c.precision.precision = precision;
  c.run.batch_size = 8;
  c.run.epochs = 1;
  c.run.max_steps = 2;
  c.run.device = "cpu";
  c.run.threads = 1;
  c.run.progress = "none";
  c.run.checkpoint_dir = checkpoint_dir;
  c.optim.schedule = "constant";
  return c;
}

// nn.TransformerEncoderLayer trains under CPU autocast to bfloat16, but its eval-mode fast path fails there
// with torch 1.13 (expected scalar type BFloat16 but found Float): refused before the first step, not after
// the last, with the file, the mode and LibTorch's message in one error.
TEST(ModelProbe, AModelThatCannotEvaluateUnderAutocastIsRefusedBeforeTraining) {
  const testing::TempDir dir;
  const auto c = vit_run("amp-bf16", dir.file("ck"));
  int steps = 0;
  TrainHooks hooks;
  hooks.on_step = [&](const StepReport&) { ++steps; };
  std::string message;
  try {
    train(make_plan(c), "test", hooks);
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_EQ(steps, 0) << "the model was refused only after training";
  EXPECT_NE(message.find("--model " + c.model.name + ": forward fails in eval mode (no gradients)"), std::string::npos)
      << message;
  EXPECT_NE(message.find("--precision amp-bf16 (autocast to BFloat16 on cpu)"), std::string::npos) << message;
  EXPECT_NE(message.find("expected scalar type BFloat16 but found Float"), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

TEST(ModelProbe, TheSameModelInFp32TrainsAndEvaluates) {
  const testing::TempDir dir;
  const auto record = train(make_plan(vit_run("fp32", dir.file("ck"))), "test");
  EXPECT_EQ(record.steps, 2);
  EXPECT_TRUE(record.final_test_accuracy.has_value());
}

// bn.pt holds batch norm (running statistics, an int64 counter) and dropout (random numbers in train mode).
TEST(ModelProbe, LeavesTheBuffersTheModeAndTheRandomStreamAsTheyWere) {
  models::ScriptInput input;
  input.sample_shape = {3, 16, 16};
  input.classes = 4;
  auto model = models::TorchScriptModel::load(fixture("bn.pt"), input);
  model->train(true);
  std::vector<torch::Tensor> before;
  for (const auto& buffer : model->buffers()) before.push_back(buffer.clone());
  ASSERT_FALSE(before.empty());
  precision::PrecisionPolicy fp32;

  torch::manual_seed(7);
  probe_as_trained(*model, "bn.pt", torch::randn({2, 3, 16, 16}), fp32, torch::kCPU);
  const auto after_probe = torch::rand({8});
  torch::manual_seed(7);
  torch::randn({2, 3, 16, 16});
  EXPECT_TRUE(torch::equal(after_probe, torch::rand({8}))) << "the probe drew from the random stream";

  EXPECT_TRUE(model->is_training());
  size_t i = 0;
  for (const auto& buffer : model->buffers()) EXPECT_TRUE(torch::equal(buffer, before[i++])) << "buffer " << i - 1;
}

}  // namespace
}  // namespace ptrain::train
