// End-to-end: gpt-tiny learns the synthetic tokens' Markov chain through the trainer, in fp32 and in the
// bfloat16 modes; the trainer refuses a language model on images and the reverse by their flags.
#include <gtest/gtest.h>

#include <cmath>

#include "ptrain/core/error.h"
#include "ptrain/train/plan.h"
#include "ptrain/train/progress.h"
#include "ptrain/train/trainer.h"
#include "test_support.h"

namespace {

constexpr int64_t kVocab = 32;

ptrain::config::TrainConfig gpt_run(int64_t sequences = 1024) {
  ptrain::config::TrainConfig c;
  c.model.name = "gpt-tiny";
  c.data.dataset = "synthetic-tokens";
  c.data.path = std::to_string(sequences) + ":32:" + std::to_string(kVocab);
  c.run.batch_size = 16;
  c.run.epochs = 2;
  c.run.device = "cpu";
  c.run.seed = 3;
  c.run.threads = 1;  // a model this small only loses to thread hand-offs
  c.run.progress = "none";
  c.optim.name = "adamw";
  c.optim.lr = 3e-3;
  c.optim.weight_decay = 0.01;
  c.optim.warmup_steps = 10;
  return c;
}

// Chance is ln(32) = 3.47 nats a token; the chain's own entropy is about 1.1 nats, its best next-token accuracy
// about 0.6.
void expect_learns(const ptrain::metrics::RunRecord& r, int64_t sequences, double loss_bound, double accuracy_bound) {
  ASSERT_EQ(r.epochs_detail.size(), 2u);
  const double chance = std::log(static_cast<double>(kVocab));
  EXPECT_LT(r.epochs_detail[1].train_loss, r.epochs_detail[0].train_loss);
  EXPECT_LT(r.epochs_detail[0].train_loss, chance);
  ASSERT_TRUE(r.final_test_loss.has_value());
  EXPECT_LT(*r.final_test_loss, loss_bound) << "chance is " << chance;
  EXPECT_GT(*r.final_test_loss, 0.9) << "below the chain's entropy: the test split leaks";
  ASSERT_TRUE(r.final_test_accuracy.has_value());
  EXPECT_GT(*r.final_test_accuracy, accuracy_bound);
  EXPECT_LT(*r.final_test_accuracy, 0.8);
  EXPECT_EQ(r.steps, 2 * sequences / 16);
  EXPECT_EQ(r.image_size, 0);
}

TEST(GptTraining, TinyLearnsTheSyntheticChainInFp32) {
  const auto r = ptrain::train::train(ptrain::train::make_plan(gpt_run()), "test");
  expect_learns(r, 1024, 1.6, 0.45);
  // Model FLOPs of a step by hand: 32 tokens through 2 blocks of width 64 (24 x 64^2 a token and block), the head
  // (2 x 64 x 32 a token) and attention over 32 x 32 (4 x 32^2 x 64 a block), x 3, x 16 sequences; on the CPU no
  // peak is known, so TFLOP/s but no MFU.
  const double forward = 32.0 * (2 * 24.0 * 64 * 64 + 2.0 * 64 * kVocab) + 2 * 4.0 * 32 * 32 * 64;
  ASSERT_TRUE(r.model_flops_per_step && r.tflops && r.steady_images_per_second);
  EXPECT_DOUBLE_EQ(*r.model_flops_per_step, 3 * forward * 16);
  EXPECT_DOUBLE_EQ(*r.tflops, 3 * forward * *r.steady_images_per_second / 1e12);
  EXPECT_FALSE(r.mfu);
  EXPECT_FALSE(r.peak_tflops);
  EXPECT_EQ(r.peak_tflops_basis, "");
}

TEST(GptTraining, TinyLearnsInAmpBf16AndPureBf16WithMasters) {
  auto amp = gpt_run(512);
  amp.precision.precision = "amp-bf16";
  expect_learns(ptrain::train::train(ptrain::train::make_plan(amp), "test"), 512, 1.7, 0.4);
  auto pure = gpt_run(512);
  pure.precision.precision = "bf16";
  pure.precision.master_weights = true;
  pure.model.activation_checkpointing = true;
  expect_learns(ptrain::train::train(ptrain::train::make_plan(pure), "test"), 512, 1.7, 0.4);
}

TEST(GptTraining, ModelAndDataMustAgree) {
  auto gpt_on_images = gpt_run();
  gpt_on_images.data.dataset = "synthetic";
  gpt_on_images.data.path = "64:1x8x8:4";
  auto message = ptrain::testing::error_message<ptrain::Error>(
      [&] { ptrain::train::train(ptrain::train::make_plan(gpt_on_images), "test"); });
  EXPECT_NE(message.find("--model gpt-tiny is a language model"), std::string::npos) << message;

  auto resnet_on_tokens = gpt_run();
  resnet_on_tokens.model.name = "resnet20";
  message = ptrain::testing::error_message<ptrain::Error>(
      [&] { ptrain::train::train(ptrain::train::make_plan(resnet_on_tokens), "test"); });
  EXPECT_NE(message.find("image model"), std::string::npos) << message;

  auto shaped_resnet = gpt_run();
  shaped_resnet.model.name = "resnet20";
  shaped_resnet.model.gpt_width = 128;
  message = ptrain::testing::error_message<ptrain::Error>([&] { ptrain::train::make_plan(shaped_resnet); });
  EXPECT_NE(message.find("--gpt-width applies to GPT models only"), std::string::npos) << message;

  auto sequences_of_images = gpt_run();
  sequences_of_images.data.dataset = "synthetic";
  sequences_of_images.data.seq_len = 16;
  message = ptrain::testing::error_message<ptrain::Error>([&] { ptrain::train::make_plan(sequences_of_images); });
  EXPECT_NE(message.find("--seq-len applies to token datasets"), std::string::npos) << message;

  auto small_vocab = gpt_run();
  small_vocab.model.vocab_size = 16;
  message = ptrain::testing::error_message<ptrain::Error>(
      [&] { ptrain::train::train(ptrain::train::make_plan(small_vocab), "test"); });
  EXPECT_NE(message.find("--vocab-size 16"), std::string::npos) << message;
}

// A vocabulary larger than the data's (as GPT-2 pads 50257 to 50304) and a reshaped model train too.
TEST(GptTraining, LargerVocabularyAndShapeFlags) {
  auto c = gpt_run();
  c.model.vocab_size = 40;
  c.model.gpt_layers = 1;
  c.model.gpt_width = 48;
  c.model.gpt_heads = 3;
  c.run.epochs = 1;
  c.run.max_steps = 20;
  const auto r = ptrain::train::train(ptrain::train::make_plan(c), "test");
  ASSERT_EQ(r.epochs_detail.size(), 1u);
  EXPECT_LT(r.epochs_detail[0].train_loss, std::log(40.0));
  ASSERT_TRUE(r.model_state_param_bytes.has_value());
  // fp32 parameters: one block of width 48, 40 token and 32 position embeddings, ln_f and the untied head.
  const int64_t block = 4 * 48 + (48 * 144 + 144) + (48 * 48 + 48) + (48 * 192 + 192) + (192 * 48 + 48);
  EXPECT_EQ(*r.model_state_param_bytes, 4 * (40 * 48 + 32 * 48 + block + 2 * 48 + 40 * 48));
}

// The record counts a language model's throughput in tokens/s; its progress lines and epoch summaries said img/s,
// counting sequences.
TEST(GptTraining, ProgressAndEpochLinesSayTokensPerSecondAsTheRecordDoes) {
  EXPECT_EQ(ptrain::train::throughput_text(100.4, 0), "100 img/s");
  EXPECT_EQ(ptrain::train::throughput_text(100.0, 32), "3200 tokens/s");

  auto c = gpt_run(128);
  c.run.epochs = 1;
  c.run.max_steps = 2;
  c.optim.warmup_steps = 0;
  c.run.log_every = 1;
  c.run.progress = "lines";
  ::testing::internal::CaptureStdout();
  ptrain::metrics::RunRecord r;
  std::string error;
  try {
    r = ptrain::train::train(ptrain::train::make_plan(c), "test");
  } catch (const std::exception& e) {
    error = e.what();
  }
  const std::string out = ::testing::internal::GetCapturedStdout();
  ASSERT_EQ(error, "");
  ASSERT_TRUE(r.tokens_per_second.has_value());
  EXPECT_NE(out.find("step 1/"), std::string::npos) << out;
  EXPECT_NE(out.find(" tokens/s  loss"), std::string::npos) << out;
  EXPECT_NE(out.find("epoch 1: "), std::string::npos) << out;
  EXPECT_EQ(out.find("img/s"), std::string::npos) << out;
}

}  // namespace
