// Training with the whole step captured as a CUDA graph gives the run training without it gives: the same
// losses step by step and the same weights, within the rounding of kernels cuDNN may pick differently.
#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>

#include "gpu.h"
#include "temp_dir.h"
#include "ptrain/distributed/ports.h"
#include "ptrain/distributed/process_group.h"
#include "ptrain/train/checkpoint.h"
#include "ptrain/train/checkpoint_staging.h"
#include "ptrain/train/plan.h"
#include "ptrain/train/trainer.h"

namespace {

ptrain::config::TrainConfig small_run(bool graphs, const std::string& precision, const std::string& model) {
  ptrain::config::TrainConfig c;
  c.model.name = model;
  if (model.rfind("gpt", 0) == 0) {
    c.data.dataset = "synthetic-tokens";
    c.data.path = "512:32:64";
    c.optim.name = "adamw";
    c.optim.lr = 1e-3;
  } else {
    c.data.dataset = "synthetic";
    c.data.path = "512:3x32x32:10";
    c.optim.lr = 0.05;
  }
  c.precision.precision = precision;
  c.run.batch_size = 32;
  c.run.epochs = 1;
  c.run.max_steps = 12;
  c.run.device = "cuda:0";
  c.run.seed = 5;
  c.run.progress = "none";
  c.run.log_every = 4;
  c.run.eval_each_epoch = false;
  c.data.test_limit = 64;
  c.data.augment = false;
  c.optim.warmup_steps = 2;
  c.run.cuda_graphs = graphs;
  return c;
}

void compare(const std::string& precision, const std::string& model, const std::string& strategy = "single") {
  auto graphed_config = small_run(true, precision, model), eager_config = small_run(false, precision, model);
  graphed_config.run.strategy = eager_config.run.strategy = strategy;
  at::globalContext().setDeterministicCuDNN(true);
  const auto graphed = ptrain::train::train(ptrain::train::make_plan(graphed_config), "test");
  const auto eager = ptrain::train::train(ptrain::train::make_plan(eager_config), "test");
  at::globalContext().setDeterministicCuDNN(false);
  const std::string what = model + " " + precision + " " + strategy;
  ASSERT_TRUE(graphed.cuda_graphs.has_value());
  EXPECT_TRUE(*graphed.cuda_graphs) << what << ": " << graphed.cuda_graphs_note;
  EXPECT_FALSE(*eager.cuda_graphs);
  ASSERT_EQ(graphed.steps, eager.steps);
  ASSERT_EQ(graphed.epochs_detail.size(), 1u);
  const double a = graphed.epochs_detail[0].train_loss, b = eager.epochs_detail[0].train_loss;
  EXPECT_NEAR(a, b, 1e-3 * std::abs(b)) << what;
  ASSERT_TRUE(graphed.final_test_loss && eager.final_test_loss);
  EXPECT_NEAR(*graphed.final_test_loss, *eager.final_test_loss, 2e-3 * std::abs(*eager.final_test_loss)) << what;
  ASSERT_TRUE(graphed.step_phase_seconds.is_object()) << what;
  EXPECT_GT(graphed.step_phase_seconds["backward"].get<double>(), 0.0) << what;
}

TEST(CapturedStep, TrainsLikeTheEagerStep) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  compare("fp32", "resnet20");
  compare("amp-fp16", "resnet20");  // the loss scaler's skip decisions on the device
  compare("amp-bf16", "gpt-tiny");
}

// The multi-process strategies over NCCL at world size 1, their all-reduces, reduce-scatters, all-gathers and the
// loss scaler's found-inf all-reduce recorded in the graph: each trains as its eager step does.
TEST(CapturedStep, StrategiesOverNcclTrainLikeTheirEagerStep) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  if (!ptrain::distributed::ProcessGroup::backend_available("nccl")) GTEST_SKIP() << "this build has no NCCL";
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  for (const std::string strategy : {"ddp", "zero1", "zero2", "zero3", "fsdp"}) {
    setenv("MASTER_PORT", std::to_string(ptrain::distributed::free_tcp_port()).c_str(), 1);
    compare("amp-fp16", "resnet20", strategy);
    setenv("MASTER_PORT", std::to_string(ptrain::distributed::free_tcp_port()).c_str(), 1);
    compare("amp-bf16", "gpt-tiny", strategy);
  }
}

TEST(CapturedStep, CpuRunsSayWhyTheyRunEagerly) {
  auto c = small_run(true, "fp32", "resnet20");
  c.run.device = "cpu";
  c.run.max_steps = 2;
  c.run.threads = 1;
  c.data.path = "64:3x16x16:4";
  c.run.batch_size = 8;
  c.data.test_limit = 8;
  const auto record = ptrain::train::train(ptrain::train::make_plan(c), "test");
  ASSERT_TRUE(record.cuda_graphs.has_value());
  EXPECT_FALSE(*record.cuda_graphs);
  EXPECT_NE(record.cuda_graphs_note.find("CUDA device"), std::string::npos) << record.cuda_graphs_note;
  EXPECT_EQ(record.kernels["optimizer"], "foreach");
  EXPECT_EQ(record.kernels["cross_entropy"], "reference");
}

}  // namespace

namespace {

// --async-checkpoint on a GPU with room: a snapshot on the device, ordered after the work queued before the
// save and before the updates queued after it, then copied to host memory by another thread.
TEST(CheckpointStaging, ADeviceSnapshotHoldsTheStateAtTheSaveWhileUpdatesRunBesideItsCopy) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  const auto on_gpu = torch::TensorOptions().device(torch::kCUDA, 0);
  auto weight = torch::zeros({64, 1024, 1024}, on_gpu);  // 256 MiB
  weight.add_(1);                                         // queued before the save: in the copy
  auto staged = ptrain::train::stage_sections({{{"w", weight}, {"step", torch::full({1}, 4.0)}}});
  EXPECT_EQ(staged->place(), ptrain::train::StagingPlace::device);
  EXPECT_EQ(staged->device_bytes(), weight.numel() * 4);
  for (int i = 0; i < 20; ++i) weight.mul_(3);  // queued after: never in the copy
  std::vector<ptrain::io::NamedTensors> sections;
  std::thread writer([&] { sections = staged->finish(); });
  writer.join();
  ASSERT_EQ(sections.size(), 1u);
  const auto& copy = sections[0][0].second;
  EXPECT_TRUE(copy.device().is_cpu());
  EXPECT_TRUE(copy.is_pinned());
  EXPECT_TRUE(torch::equal(copy, torch::ones({64, 1024, 1024})));
  EXPECT_EQ(sections[0][1].second.item<float>(), 4.0f);
}

// The writer reads a checkpoint as its copies to host memory arrive: begin_host_copies() returns at once, and
// bytes waited for (from several threads, last tensor first) hold the state at the save, over many arrival
// events. A snapshot dropped with its copies still in flight (a write that failed) waits for them first.
TEST(CheckpointStaging, HostCopiesArriveInPiecesAndEachWaitedForHoldsTheSave) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  const auto on_gpu = torch::TensorOptions().device(torch::kCUDA, 0);
  std::vector<torch::Tensor> weights;
  ptrain::io::NamedTensors section;
  for (int i = 0; i < 6; ++i) {
    weights.push_back(torch::full({48, 1024, 1024}, static_cast<float>(i), on_gpu));  // 192 MiB each
    section.emplace_back("w" + std::to_string(i), weights.back());
  }
  auto staged = ptrain::train::stage_sections({section});
  ASSERT_EQ(staged->place(), ptrain::train::StagingPlace::device);
  for (auto& weight : weights) weight.mul_(-7);  // after the save: never in the copies
  std::vector<ptrain::io::NamedTensors> sections = staged->begin_host_copies();
  ASSERT_EQ(sections.size(), 1u);
  ASSERT_EQ(sections[0].size(), 6u);
  std::vector<std::thread> readers;
  std::vector<int> equal(6, 0);
  for (int i = 5; i >= 0; --i)
    readers.emplace_back([&, i] {
      const auto& copy = sections[0][i].second;
      staged->wait_until_copied(static_cast<const char*>(copy.data_ptr()) + copy.nbytes() - 1);
      staged->wait_until_copied(copy.data_ptr());
      equal[i] = torch::equal(copy, torch::full({48, 1024, 1024}, static_cast<float>(i)));
    });
  for (auto& reader : readers) reader.join();
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(equal[i]) << "tensor " << i;
  auto dropped = ptrain::train::stage_sections({section});
  dropped->begin_host_copies();
  dropped.reset();
}

// A HostStagingArea's block, pinned in the background by reserve(), takes every save's copies, each tensor at
// its own aligned offset: the second save reuses the first's block and holds the second state.
TEST(CheckpointStaging, SavesCopyIntoOnePinnedBlockReservedBeforeTheFirst) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  const auto on_gpu = torch::TensorOptions().device(torch::kCUDA, 0);
  ptrain::io::NamedTensors section = {{"w", torch::full({3, 1000}, 1.0f, on_gpu)},
                                      {"b", torch::full({7}, 2.0, on_gpu.dtype(torch::kDouble))},
                                      {"host", torch::full({2}, 5.0f)}};
  auto area = std::make_shared<ptrain::train::HostStagingArea>();
  area->reserve({section});
  const char* first_block = nullptr;
  for (float save : {1.0f, 2.0f}) {
    for (auto& [name, tensor] : section)
      if (tensor.is_cuda()) tensor.fill_(save * (name == "w" ? 1 : 2));
    auto copies = ptrain::train::stage_sections({section}, area)->finish().at(0);
    ASSERT_EQ(copies.size(), 3u);
    const auto& w = copies[0].second;
    const auto& b = copies[1].second;
    EXPECT_TRUE(w.is_pinned());
    EXPECT_TRUE(torch::equal(w, torch::full({3, 1000}, save)));
    EXPECT_TRUE(torch::equal(b, torch::full({7}, 2.0 * save, torch::kDouble)));
    EXPECT_EQ(static_cast<const char*>(b.data_ptr()) - static_cast<const char*>(w.data_ptr()),
              (3000 * 4 + ptrain::train::kStagingAlignment - 1) / ptrain::train::kStagingAlignment *
                  ptrain::train::kStagingAlignment);
    EXPECT_TRUE(torch::equal(copies[2].second, torch::full({2}, 5.0f)));
    if (first_block == nullptr) first_block = static_cast<const char*>(w.data_ptr());
    EXPECT_EQ(static_cast<const char*>(w.data_ptr()), first_block) << "save " << save << " pinned a block of its own";
  }
}

// A synchronous save's copy: each CUDA tensor into the area's pinned block (a transposed one in its logical
// order, a bf16 one of an odd size at its aligned offset), the host tensors as they are; the next save reuses
// the block. A device snapshot of the same sections holds the same values.
TEST(CheckpointStaging, ASynchronousSaveCopiesIntoThePinnedBlockAndMatchesTheSnapshot) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  const auto on_gpu = torch::TensorOptions().device(torch::kCUDA, 0);
  const auto base = torch::arange(12, on_gpu.dtype(torch::kFloat)).reshape({3, 4});
  ptrain::io::NamedTensors section = {{"t", base.t()},
                                      {"h", torch::arange(5, on_gpu.dtype(torch::kBFloat16))},
                                      {"host", torch::full({2}, 5.0f)}};
  ptrain::train::HostStagingArea area;
  const char* first_block = nullptr;
  for (int save = 0; save < 2; ++save) {
    if (save == 1) section[1].second.add_(1);
    const auto copies = ptrain::train::copy_to_pinned_host({section}, area).at(0);
    ASSERT_EQ(copies.size(), 3u);
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_TRUE(copies[i].second.device().is_cpu()) << copies[i].first;
      EXPECT_TRUE(copies[i].second.is_pinned()) << copies[i].first;
      EXPECT_TRUE(torch::equal(copies[i].second, section[i].second.cpu())) << copies[i].first << " save " << save;
    }
    EXPECT_EQ(copies[2].second.data_ptr(), section[2].second.data_ptr());
    if (first_block == nullptr) first_block = static_cast<const char*>(copies[0].second.data_ptr());
    EXPECT_EQ(static_cast<const char*>(copies[0].second.data_ptr()), first_block) << "save " << save;
  }
  const auto snapshot = ptrain::train::stage_sections({section})->finish().at(0);
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(torch::equal(snapshot[i].second, section[i].second.cpu())) << snapshot[i].first;
}

// The check before every save, on a GPU (StepEngine::finite's fused path), with fp32 and with bf16 parameters,
// saving synchronously and not: a run that trains well saves every checkpoint it is asked for; one whose
// learning rate of 1e6 turns its weights non-finite saves none that is not finite, and says where it diverged.
TEST(CheckpointStaging, OnAGpuADivergedStateIsNeverSavedAndAFiniteOneIs) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  for (const std::string precision : {"fp32", "bf16"})
    for (const bool async : {false, true})
      for (const double lr : {1e-3, 1e6}) {
        const std::string what = precision + (async ? " async" : " sync") + " lr " + std::to_string(lr);
        ptrain::testing::TempDir tmp;
        auto c = small_run(/*graphs=*/true, precision, "resnet20");
        c.optim.lr = lr;
        c.run.checkpoint_dir = tmp.path();
        c.run.checkpoint_every = 4;
        c.run.keep_checkpoints = 0;
        c.run.on_divergence = "warn";
        c.run.async_checkpoint = async;
        const auto record = ptrain::train::train(ptrain::train::make_plan(c), "test");
        const auto saved = ptrain::train::list_checkpoints(tmp.path());
        if (lr < 1) {
          EXPECT_FALSE(record.diverged_at_step.has_value()) << what;
          EXPECT_EQ(saved.size(), 3u) << what;
        } else {
          EXPECT_TRUE(record.diverged_at_step.has_value()) << what;
        }
        for (const auto& path : saved)
          for (const auto& [name, tensor] : ptrain::train::load_checkpoint(path).model)
            if (tensor.is_floating_point()) EXPECT_TRUE(torch::isfinite(tensor).all().item<bool>()) << what << " " << path << " " << name;
      }
}

}  // namespace
