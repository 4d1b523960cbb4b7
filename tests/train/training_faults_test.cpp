// Training runs that stop, resume and diverge: nothing lost, nothing silent.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "multiprocess.h"
#include "ptrain/core/error.h"
#include "ptrain/train/checkpoint.h"
#include "ptrain/train/plan.h"
#include "ptrain/train/progress.h"
#include "ptrain/train/trainer.h"
#include "test_support.h"

namespace {

namespace fs = std::filesystem;

// 8 steps an epoch of 8 samples (64 of 4 classes, 8x8 images): a few seconds on one thread.
ptrain::config::TrainConfig tiny_run(const std::string& checkpoint_dir) {
  ptrain::config::TrainConfig c;
  c.model.name = "resnet20";
  c.data.dataset = "synthetic";
  c.data.path = "64:3x8x8:4";
  c.data.test_limit = 16;
  c.run.batch_size = 8;
  c.run.epochs = 2;
  c.run.device = "cpu";
  c.run.threads = 1;
  c.run.seed = 3;
  c.run.progress = "none";
  c.run.log_every = 2;
  c.run.checkpoint_dir = checkpoint_dir;
  c.optim.lr = 0.05;
  c.optim.schedule = "constant";
  return c;
}

ptrain::metrics::RunRecord train(const ptrain::config::TrainConfig& c) {
  return ptrain::train::train(ptrain::train::make_plan(c), "test");
}

std::map<std::string, torch::Tensor> model_of(const std::string& path) {
  std::map<std::string, torch::Tensor> out;
  for (auto& [name, t] : ptrain::train::load_checkpoint(path).model) out[name] = t;
  return out;
}

void expect_same_model(const std::string& a, const std::string& b) {
  const auto want = model_of(a), got = model_of(b);
  ASSERT_EQ(want.size(), got.size());
  for (const auto& [name, tensor] : want) EXPECT_TRUE(torch::equal(got.at(name), tensor)) << name;
}

// A run stopped by --max-steps inside an epoch saves where it stopped: resumed, it finishes that epoch and
// ends where the run that was never stopped ends, weights and all.
TEST(TrainingFaults, ResumeAfterAMaxStepsStopContinuesTheEpoch) {
  ptrain::testing::TempDir tmp;
  auto whole = tiny_run(tmp.file("whole"));
  const auto uninterrupted = train(whole);
  ASSERT_EQ(uninterrupted.steps, 16);

  auto stopped = tiny_run(tmp.file("stopped"));
  stopped.run.max_steps = 5;
  EXPECT_EQ(train(stopped).steps, 5);
  const auto position = ptrain::train::load_checkpoint(ptrain::train::latest_checkpoint(stopped.run.checkpoint_dir)).position;
  EXPECT_EQ(position.epoch, 0);
  EXPECT_EQ(position.micro_batch, 5);

  auto resumed = stopped;
  resumed.run.max_steps = 0;
  resumed.run.resume = "latest";
  const auto record = train(resumed);
  EXPECT_EQ(record.steps, 16);
  expect_same_model(ptrain::train::checkpoint_path(whole.run.checkpoint_dir, 16),
                    ptrain::train::checkpoint_path(stopped.run.checkpoint_dir, 16));
  ASSERT_EQ(record.epochs_detail.size(), 2u);  // the rest of epoch 1, then epoch 2
  EXPECT_DOUBLE_EQ(*record.epochs_detail[0].train_accuracy, *uninterrupted.epochs_detail[0].train_accuracy);
  EXPECT_DOUBLE_EQ(record.epochs_detail[0].train_loss, uninterrupted.epochs_detail[0].train_loss);
}

// --stop-at-step pauses a run on the whole run's schedule: resumed from the pause, it ends on the weights of
// the run never paused. Cosine with warm-up makes every step's rate depend on the run's length, which a
// stop by --max-steps (the run's length) changes.
void paused_and_resumed_ends_where_the_whole_run_ends(ptrain::config::TrainConfig c, int64_t pause_at) {
  ptrain::testing::TempDir tmp;
  c.optim.schedule = "cosine";
  c.optim.warmup_steps = 3;
  c.run.checkpoint_dir = tmp.file("whole");
  const auto whole = train(c);
  ASSERT_GT(whole.steps, pause_at);

  auto paused = c;
  paused.run.checkpoint_dir = tmp.file("paused");
  paused.run.stop_at_step = pause_at;
  const auto pause = train(paused);
  EXPECT_EQ(pause.steps, pause_at);
  EXPECT_FALSE(pause.final_test_accuracy.has_value()) << "a pause evaluates nothing";
  ASSERT_EQ(ptrain::train::latest_checkpoint(paused.run.checkpoint_dir),
            ptrain::train::checkpoint_path(paused.run.checkpoint_dir, pause_at));

  auto resumed = paused;
  resumed.run.stop_at_step = 0;
  resumed.run.resume = "latest";
  const auto record = train(resumed);
  EXPECT_EQ(record.steps, whole.steps);
  expect_same_model(ptrain::train::checkpoint_path(c.run.checkpoint_dir, whole.steps),
                    ptrain::train::checkpoint_path(paused.run.checkpoint_dir, whole.steps));
  ASSERT_TRUE(record.final_test_accuracy.has_value());
  EXPECT_DOUBLE_EQ(*record.final_test_accuracy, *whole.final_test_accuracy);
}

TEST(TrainingFaults, PauseInsideAnEpochResumesBitForBitUnderCosineWithWarmUp) {
  paused_and_resumed_ends_where_the_whole_run_ends(tiny_run(""), 5);  // 8 steps an epoch, 16 in all
}

TEST(TrainingFaults, PauseAtAnEpochsEndResumesBitForBitAndEvaluatesThatEpoch) {
  paused_and_resumed_ends_where_the_whole_run_ends(tiny_run(""), 8);
}

TEST(TrainingFaults, PauseWithGradientAccumulationResumesBitForBit) {
  auto c = tiny_run("");
  c.optim.grad_accum = 2;  // 4 steps an epoch of two micro-batches, 8 in all
  paused_and_resumed_ends_where_the_whole_run_ends(c, 3);
}

// --grad-accum 3 over 8 micro-batches an epoch trained two steps of three and dropped the last two micro-batches
// of every epoch without a word. The last step of an epoch takes the ones left; a pause after it resumes bit
// for bit.
TEST(TrainingFaults, GradientAccumulationTrainsAnEpochsLastMicroBatchesInAShorterStep) {
  auto c = tiny_run("");
  c.run.epochs = 1;
  c.optim.grad_accum = 3;  // windows of 3, 3 and 2 micro-batches of 8 samples
  ptrain::train::TrainHooks hooks;
  std::vector<double> losses;
  hooks.on_step = [&](const ptrain::train::StepReport& step) { losses.push_back(step.loss); };
  const auto record = ptrain::train::train(ptrain::train::make_plan(c), "test", hooks);
  EXPECT_EQ(record.steps, 3);
  ASSERT_EQ(record.epochs_detail.size(), 1u);
  EXPECT_EQ(record.epochs_detail[0].images, 64);  // every sample
  EXPECT_EQ(losses.size(), 3u);

  auto two_epochs = tiny_run("");
  two_epochs.optim.grad_accum = 3;
  paused_and_resumed_ends_where_the_whole_run_ends(two_epochs, 3);  // the pause after the short step
}

// --max-steps is Hugging Face's max_steps: it overrides --epochs. A run of 8 steps an epoch and --max-steps 20
// used to stop after its one epoch's 8 steps, exit 0 and say nothing.
TEST(TrainingFaults, MaxStepsBeyondTheEpochsTrainsOnOverAsManyEpochsAsItTakes) {
  auto c = tiny_run("");
  c.run.epochs = 1;
  c.run.max_steps = 20;
  const auto record = train(c);
  EXPECT_EQ(record.steps, 20);
  EXPECT_EQ(record.epochs, 3);
  EXPECT_EQ(record.epochs_detail.size(), 3u);
  c.run.max_steps = 5;  // fewer than an epoch: ends there, as before
  EXPECT_EQ(train(c).steps, 5);
}

// Pure bf16 cast BatchNorm's num_batches_tracked to bf16 with the weights, where it stops counting at 256:
// integer buffers stay integers, as under PyTorch's model.half().
TEST(TrainingFaults, PureHalfPrecisionKeepsIntegerBuffersIntegers) {
  ptrain::testing::TempDir tmp;
  auto c = tiny_run(tmp.file("bf16"));
  c.run.epochs = 1;
  c.precision.precision = "bf16";
  ASSERT_EQ(train(c).steps, 8);
  const auto model = model_of(ptrain::train::checkpoint_path(c.run.checkpoint_dir, 8));
  const auto& tracked = model.at("bn1.num_batches_tracked");
  EXPECT_EQ(tracked.scalar_type(), torch::kLong);
  EXPECT_EQ(tracked.item<int64_t>(), 8);
  EXPECT_EQ(model.at("bn1.running_mean").scalar_type(), torch::kBFloat16);
}

// The same under fsdp on two processes over gloo (64 samples, 8 a rank: 4 steps an epoch, 8 in all).
TEST(TrainingFaults, PauseUnderFsdpOnTwoRanksResumesBitForBit) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  const std::string dir = ptrain::testing::temp_dir("pause_fsdp");
  const auto run_two = [&](const std::string& name, int64_t stop_at_step, const std::string& resume) {
    const int port = ptrain::testing::free_port();
    const auto outcomes = ptrain::testing::run_world(2, [&](int rank) {
      ptrain::testing::set_launch_environment(rank, 2, port);
      auto c = tiny_run(dir + "/" + name);
      c.run.strategy = "fsdp";
      c.optim.schedule = "cosine";
      c.optim.warmup_steps = 3;
      c.run.stop_at_step = stop_at_step;
      c.run.resume = resume;
      c.dist.timeout_seconds = 60;
      train(c);
    }, 180);
    for (const auto& o : outcomes) ASSERT_EQ(o.exit_code, 0) << o.message;
  };
  run_two("whole", 0, "");
  run_two("paused", 3, "");
  ASSERT_EQ(ptrain::train::latest_checkpoint(dir + "/paused"), ptrain::train::checkpoint_path(dir + "/paused", 3));
  run_two("paused", 0, "latest");
  expect_same_model(ptrain::train::checkpoint_path(dir + "/whole", 8), ptrain::train::checkpoint_path(dir + "/paused", 8));
  ptrain::testing::remove_tree(dir);
}

// The issue's case: a run stopped at step 12, resumed from its step 4 and stopped at 6 (which says "continue
// with --resume latest"); --resume latest then continued the abandoned step 12 and lost steps 5-6 of the
// new line unsaid. It continues from step 6, and says which checkpoints it passes over.
TEST(TrainingFaults, ResumeLatestContinuesTheResumedLineNotTheAbandonedBranch) {
  ptrain::testing::TempDir tmp;
  auto c = tiny_run(tmp.file("ck"));
  c.run.checkpoint_every = 4;
  c.run.stop_at_step = 12;
  ASSERT_EQ(train(c).steps, 12);

  auto branch = c;
  branch.run.resume = ptrain::train::checkpoint_path(c.run.checkpoint_dir, 4);
  branch.run.stop_at_step = 6;
  ASSERT_EQ(train(branch).steps, 6);

  auto latest = c;
  latest.run.stop_at_step = 0;
  latest.run.resume = "latest";
  const auto plan = ptrain::train::make_plan(latest);
  EXPECT_EQ(plan.resume_path, ptrain::train::checkpoint_path(c.run.checkpoint_dir, 6));
  for (const char* text : {"the newest checkpoint of the line written last", "2 checkpoint(s) of later steps",
                           "step-00000008.safetensors .. step-00000012.safetensors", "never taken by latest"})
    EXPECT_NE(plan.resume_note.find(text), std::string::npos) << text << "\n" << plan.resume_note;
  std::vector<int64_t> steps;
  ptrain::train::TrainHooks hooks;
  hooks.on_step = [&](const ptrain::train::StepReport& step) { steps.push_back(step.global_step); };
  const auto record = ptrain::train::train(plan, "test", hooks);
  EXPECT_EQ(record.steps, 16);
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps.front(), 7) << "resumed from step " << steps.front() - 1;
}

std::string refusal(const ptrain::config::TrainConfig& c) {
  try {
    train(c);
  } catch (const ptrain::Error& e) {
    return e.what();
  }
  return "(no error)";
}

// A checkpoint of step 4 of 8 (one epoch), resumed by a run that ends before it: refused, naming the
// checkpoint's step, this run's last step and the flag that set it, instead of "4 steps" and exit 0.
ptrain::config::TrainConfig resume_of_step_4(const ptrain::testing::TempDir& tmp) {
  auto c = tiny_run(tmp.file("ck"));
  c.run.epochs = 1;
  c.run.checkpoint_every = 4;
  EXPECT_EQ(train(c).steps, 8);
  c.run.checkpoint_every = 0;
  c.run.resume = ptrain::train::checkpoint_path(c.run.checkpoint_dir, 4);
  return c;
}

TEST(TrainingFaults, ResumeWithNothingLeftBeforeMaxStepsIsRefused) {
  ptrain::testing::TempDir tmp;
  auto c = resume_of_step_4(tmp);
  c.run.max_steps = 2;
  const std::string message = refusal(c);
  EXPECT_NE(message.find(c.run.resume + ": the checkpoint is at step 4 and this run ends at step 2 (--max-steps 2): "
                         "nothing is left to train"),
            std::string::npos)
      << message;
  c.run.max_steps = 4;  // the run's very end: nothing left either
  EXPECT_NE(refusal(c).find("ends at step 4 (--max-steps 4)"), std::string::npos);
}

TEST(TrainingFaults, ResumeWithNothingLeftAtASmallerTrainLimitIsRefused) {
  ptrain::testing::TempDir tmp;
  auto c = resume_of_step_4(tmp);
  c.data.train_limit = 24;  // 3 steps an epoch
  const std::string message = refusal(c);
  EXPECT_NE(message.find("the checkpoint is at step 4 and this run ends at step 3 (--epochs 1 of 3 steps at "
                         "--train-limit 24)"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("--train-limit 0 -> 24"), std::string::npos) << message;
}

// The run's length (--max-steps here) sets the schedule's rates: a resume under another one goes on, and
// says in one line that its rates are not the saved run's.
TEST(TrainingFaults, ResumeUnderAnotherRunLengthSaysTheRatesChange) {
  ptrain::testing::TempDir tmp;
  auto c = resume_of_step_4(tmp);
  c.run.max_steps = 6;
  ::testing::internal::CaptureStderr();
  const auto record = train(c);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(record.steps, 6);
  EXPECT_NE(err.find("ptrain: warning: resuming " + c.run.resume + " with --max-steps 0 -> 6: the learning rates "
                     "from step 4 on follow this run's schedule"),
            std::string::npos)
      << err;
}

TEST(TrainingFaults, StopAtStepThatNeverComesIsRefused) {
  ptrain::testing::TempDir tmp;
  auto c = tiny_run(tmp.file("ck"));
  c.run.stop_at_step = 16;  // the run's last step
  EXPECT_NE(refusal(c).find("--stop-at-step 16: the run ends at step 16 (--epochs 2 of 8 steps), so it never pauses"),
            std::string::npos);
  auto resumed = resume_of_step_4(tmp);
  resumed.run.stop_at_step = 3;
  EXPECT_NE(refusal(resumed).find("--stop-at-step 3: the run resumes after step 4"), std::string::npos)
      << refusal(resumed);
}

// A learning rate of 1e6 makes the loss NaN within a few steps: the run stops with an error naming the
// step, and every checkpoint it left holds finite weights.
TEST(TrainingFaults, DivergenceStopsTheRunNamingTheStepAndSavesNothingNonFinite) {
  ptrain::testing::TempDir tmp;
  auto c = tiny_run(tmp.path());
  c.optim.lr = 1e6;
  c.run.checkpoint_every = 1;
  c.run.log_every = 4;
  std::string message;
  try {
    train(c);
  } catch (const ptrain::Error& e) {
    message = e.what();
  }
  ASSERT_NE(message.find("training diverged at step "), std::string::npos) << message;
  EXPECT_NE(message.find("--on-divergence warn"), std::string::npos) << message;
  int checkpoints = 0;
  for (const auto& path : ptrain::train::list_checkpoints(tmp.path())) {
    for (const auto& [name, tensor] : ptrain::train::load_checkpoint(path).model) {
      if (tensor.is_floating_point()) { ASSERT_TRUE(torch::isfinite(tensor).all().item<bool>()) << path << " " << name; }
    }
    ++checkpoints;
  }
  EXPECT_LT(checkpoints, 4) << "the run must stop within the log window it diverged in";
}

// Under --async-checkpoint the state is staged before the checks (so that its copies run while they wait for
// the device): one that fails them is dropped, neither written nor left as a temporary file.
TEST(TrainingFaults, DivergenceWarnTrainsOnRecordsTheStepAndSavesNoNonFiniteCheckpoint) {
  for (const bool async : {false, true}) {
    ptrain::testing::TempDir tmp;
    auto c = tiny_run(tmp.path());
    c.optim.lr = 1e6;
    c.run.epochs = 1;
    c.run.on_divergence = "warn";
    c.run.checkpoint_every = 3;
    c.run.async_checkpoint = async;
    const auto record = train(c);
    EXPECT_EQ(record.steps, 8);
    ASSERT_TRUE(record.diverged_at_step.has_value());
    EXPECT_LE(*record.diverged_at_step, 3) << "async " << async;
    EXPECT_EQ(ptrain::train::latest_checkpoint(tmp.path()), "") << "async " << async << ": a save held NaN weights";
    for (const auto& entry : fs::directory_iterator(tmp.path()))
      EXPECT_EQ(entry.path().filename().string().find(".tmp."), std::string::npos) << entry.path();
  }
}

// A run that diverges under the default --on-divergence stop ends with its record (for --metrics-out), marked
// diverged at the step, and nothing of the diverged state saved.
TEST(TrainingFaults, ADivergedRunStillHasItsRecord) {
  ptrain::testing::TempDir tmp;
  auto c = tiny_run(tmp.file("ck"));
  c.optim.lr = 1e6;
  c.run.log_every = 4;
  c.model.save_weights = tmp.file("w.pt");
  try {
    train(c);
    ADD_FAILURE() << "the run did not stop";
  } catch (const ptrain::train::RunStopped& stopped) {
    EXPECT_NE(std::string(stopped.what()).find("training diverged at step "), std::string::npos) << stopped.what();
    EXPECT_EQ(stopped.exit_code(), 2);
    const auto& record = stopped.record();
    ASSERT_TRUE(record.diverged_at_step.has_value());
    const auto& end = record.extra.at("run_end");
    EXPECT_EQ(end.at("status"), "diverged") << end.dump();
    EXPECT_TRUE(end.at("weights").is_null()) << end.dump();
  }
  EXPECT_FALSE(fs::exists(tmp.file("w.pt")));
}

// --on-divergence warn trains on: the record says diverged, not completed, and NaN weights are not written
// under the name of the trained ones.
TEST(TrainingFaults, DivergenceWarnRecordsDivergedAndWritesNoNonFiniteWeights) {
  ptrain::testing::TempDir tmp;
  auto c = tiny_run("");
  c.optim.lr = 1e6;
  c.run.epochs = 1;
  c.run.on_divergence = "warn";
  c.model.save_weights = tmp.file("w.pt");
  ::testing::internal::CaptureStderr();
  const auto record = train(c);
  const std::string warnings = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(record.diverged_at_step.has_value());
  const auto& end = record.extra.at("run_end");
  EXPECT_EQ(end.at("status"), "diverged") << end.dump();
  EXPECT_TRUE(end.at("weights").is_null()) << end.dump();
  EXPECT_EQ(end.at("weights_refused"), "the weights were not finite") << end.dump();
  EXPECT_FALSE(fs::exists(tmp.file("w.pt")));
  EXPECT_NE(warnings.find("ptrain: warning: --save-weights " + tmp.file("w.pt") + " not written: the weights after step 8 "
                          "are not finite"),
            std::string::npos)
      << warnings;
}

// A full disk under the logs (/dev/full, written in place: every write fails with ENOSPC) costs the logs, not
// the run: it trains to its end and writes its checkpoint and weights, and its record names the logs lost.
TEST(TrainingFaults, AFullDiskUnderTheLogsDoesNotStopTheRun) {
  ptrain::testing::TempDir tmp;
  auto c = tiny_run(tmp.file("ck"));
  c.run.epochs = 1;
  c.run.log_jsonl = "/dev/full";
  c.model.save_weights = tmp.file("w.pt");
  ::testing::internal::CaptureStderr();
  const auto record = train(c);
  const std::string warnings = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(record.steps, 8);
  EXPECT_NE(warnings.find("--log-jsonl /dev/full: cannot write (No space left on device); training goes on"),
            std::string::npos) << warnings;
  const auto& end = record.extra.at("run_end");
  EXPECT_EQ(end.at("status"), "completed") << end.dump();
  EXPECT_EQ(end.at("logs_given_up"), nlohmann::json::array({"--log-jsonl"})) << end.dump();
  EXPECT_TRUE(fs::is_regular_file(tmp.file("w.pt")));
  EXPECT_EQ(ptrain::train::latest_checkpoint(tmp.file("ck")), ptrain::train::checkpoint_path(tmp.file("ck"), 8));
}

// Progress lines on a full disk (stdout's buffer on /dev/full) warn once and stop; the run is not stopped.
TEST(TrainingFaults, AFullDiskUnderTheProgressLinesWarnsOnce) {
  std::filebuf full;
  ASSERT_NE(full.open("/dev/full", std::ios::out), nullptr);
  std::streambuf* const stdout_buffer = std::cout.rdbuf(&full);
  ::testing::internal::CaptureStderr();
  ptrain::train::Progress progress(ptrain::train::Progress::Style::Lines, 1, 8);
  progress.start_epoch(0);
  for (int64_t step = 1; step <= 3; ++step) EXPECT_NO_THROW(progress.update(step, 100, 0.5));
  progress.end_epoch("epoch 1: done");
  const std::string warnings = ::testing::internal::GetCapturedStderr();
  std::cout.rdbuf(stdout_buffer);
  std::cout.clear();
  EXPECT_EQ(warnings, "ptrain: warning: the progress lines cannot be written to stdout (No space left on device); "
                      "training goes on without them\n");
}

// Two processes under ddp stop mid-epoch and resume: the resumed epoch's train loss and accuracy are the
// uninterrupted run's, not rank 0's running sums counted on every rank.
TEST(TrainingFaults, MultiProcessResumeRestoresTheEpochsRunningTotals) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  const std::string dir = ptrain::testing::temp_dir("totals");
  const auto run_two = [&](const std::string& name, int64_t checkpoint_every, const std::string& resume) {
    const int port = ptrain::testing::free_port();
    const auto outcomes = ptrain::testing::run_world(2, [&](int rank) {
      ptrain::testing::set_launch_environment(rank, 2, port);
      auto c = tiny_run(dir + "/" + name);
      c.run.strategy = "ddp";
      c.run.epochs = 1;
      c.run.checkpoint_every = checkpoint_every;
      c.run.resume = resume;
      c.dist.timeout_seconds = 60;
      const auto record = train(c);
      if (rank == 0) std::ofstream(dir + "/" + name + ".json") << nlohmann::json{{"loss", record.epochs_detail.back().train_loss},
                                                                            {"accuracy", *record.epochs_detail.back().train_accuracy}};
    }, 120);
    for (const auto& o : outcomes) ASSERT_EQ(o.exit_code, 0) << o.message;
  };
  run_two("whole", 2, "");  // 4 steps of 2 x 8 samples; checkpoints at steps 2 and 4
  run_two("resumed", 0, dir + "/whole/step-00000002.safetensors");
  const auto whole = nlohmann::json::parse(std::ifstream(dir + "/whole.json"));
  const auto resumed = nlohmann::json::parse(std::ifstream(dir + "/resumed.json"));
  EXPECT_NEAR(resumed["loss"].get<double>(), whole["loss"].get<double>(), 1e-9 * std::fabs(whole["loss"].get<double>()));
  EXPECT_DOUBLE_EQ(resumed["accuracy"].get<double>(), whole["accuracy"].get<double>());
  ptrain::testing::remove_tree(dir);
}

}  // namespace
