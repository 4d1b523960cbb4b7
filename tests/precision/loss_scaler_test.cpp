#include "ptrain/precision/loss_scaler.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>

#include "ptrain/core/error.h"
#include "ptrain/precision/policy.h"
#include "oracle.h"
#include "temp_dir.h"

#if PTRAIN_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

using ptrain::precision::LossScaler;
using ptrain::precision::LossScalerOptions;

namespace {

enum class Grad { Ok, Inf, NaN };

// GradScaler's documented rules, written out on host floats (the scale is a float32 tensor in torch):
// start at init_scale; on a step with inf/NaN multiply by backoff_factor and restart the count of
// clean steps; after growth_interval consecutive clean steps multiply by growth_factor (skipped when
// the product is not finite in float32, as _amp_update_scale_'s kernel does) and restart the count.
// Hysteresis (DeepSpeed's DynamicLossScaler): only the hysteresis-th overflow backs off; a clean step
// refills the tolerance (consecutive_hysteresis), or only a step that grows the scale (DeepSpeed's
// default); the scale never backs off below min_scale.
struct ReferenceScaler {
  float scale;
  double growth, backoff, min_scale;
  int64_t interval, hysteresis;
  bool consecutive;
  int64_t clean_steps = 0;
  int64_t tolerated_left;

  explicit ReferenceScaler(const LossScalerOptions& o)
      : scale(static_cast<float>(o.init_scale)),
        growth(o.growth_factor),
        backoff(o.backoff_factor),
        min_scale(o.min_scale),
        interval(o.growth_interval),
        hysteresis(o.hysteresis),
        consecutive(o.consecutive_hysteresis),
        tolerated_left(o.hysteresis) {}

  void step(bool overflow) {
    if (overflow) {
      clean_steps = 0;
      if (tolerated_left > 1) {
        --tolerated_left;
      } else {
        scale = static_cast<float>(std::max(static_cast<double>(scale) * backoff, min_scale));
      }
      return;
    }
    if (consecutive) tolerated_left = hysteresis;
    if (++clean_steps == interval) {
      const float grown = static_cast<float>(static_cast<double>(scale) * growth);
      if (std::isfinite(grown)) scale = grown;
      if (!consecutive) tolerated_left = hysteresis;
      clean_steps = 0;
    }
  }
};

// The scripted run shared by the step-by-step test and the GradScaler oracle: isolated infs and NaNs
// at co-prime periods plus a burst of consecutive overflows.
Grad scripted_fault(int64_t step) {
  if (step >= 2000 && step < 2005) return Grad::Inf;
  if (step % 97 == 13) return Grad::Inf;
  if (step % 131 == 7) return Grad::NaN;
  return Grad::Ok;
}

// Gradients as they come out of backward: true gradients times the current scale, in three dtypes.
struct StepGrads {
  std::vector<torch::Tensor> truth;
  std::vector<torch::Tensor> scaled;
};

StepGrads make_grads(double scale, Grad fault, int64_t step, torch::Device device) {
  torch::manual_seed(step);
  StepGrads g;
  g.truth = {torch::randn({3, 4}).to(device), torch::randn({5}).to(device, torch::kBFloat16),
             torch::randn({2, 2}).to(device)};
  // Near float32's ceiling real scaled gradients would overflow; there the scaler only needs to see
  // the injected faults, so the gradients are left unscaled.
  const double multiplier = scale <= std::ldexp(1.0, 60) ? scale : 1.0;
  for (const auto& t : g.truth) g.scaled.push_back((t.to(torch::kDouble) * multiplier).to(t.scalar_type()));
  if (fault == Grad::Inf) g.scaled[step % 3].view(-1)[0] = std::numeric_limits<float>::infinity();
  if (fault == Grad::NaN) g.scaled[step % 3].view(-1)[1] = std::numeric_limits<float>::quiet_NaN();
  return g;
}

// Runs the scaler and the reference side by side; returns the scale after every update.
std::vector<double> run_against_reference(const LossScalerOptions& options, int64_t steps,
                                          const std::function<Grad(int64_t)>& fault_at,
                                          torch::Device device = torch::kCPU) {
  LossScaler scaler(options, device);
  ReferenceScaler reference(options);
  std::vector<double> sequence;
  for (int64_t step = 0; step < steps; ++step) {
    const Grad fault = fault_at(step);
    const double scale_before = scaler.current_scale();
    StepGrads g = make_grads(scale_before, fault, step, device);
    scaler.unscale_(g.scaled);
    EXPECT_EQ(scaler.found_inf().item<float>(), fault == Grad::Ok ? 0.0f : 1.0f) << "step " << step;
    // Powers of two: the unscaled gradients are the true ones exactly (checked while the scale is one).
    if (fault == Grad::Ok && std::log2(scale_before) == std::floor(std::log2(scale_before)) &&
        scale_before <= std::ldexp(1.0, 60)) {
      for (size_t i = 0; i < g.truth.size(); ++i) {
        EXPECT_TRUE(torch::equal(g.scaled[i], g.truth[i])) << "step " << step << " grad " << i;
      }
    }
    scaler.update();
    reference.step(fault != Grad::Ok);
    EXPECT_EQ(scaler.current_scale(), static_cast<double>(reference.scale)) << "step " << step;
    if (scaler.current_scale() != static_cast<double>(reference.scale)) break;
    sequence.push_back(scaler.current_scale());
  }
  return sequence;
}

}  // namespace

TEST(LossScaler, FiveThousandStepsWithGrowthIntervalThree) {
  LossScalerOptions options;
  options.growth_interval = 3;
  const auto sequence = run_against_reference(options, 5000, scripted_fault);
  ASSERT_EQ(sequence.size(), 5000u);
  // The run must reach the float32 ceiling 2^127, where the finite-growth rule holds the scale.
  EXPECT_EQ(*std::max_element(sequence.begin(), sequence.end()), std::ldexp(1.0, 127));
  EXPECT_EQ(sequence[0], 65536.0);  // one clean step of three: no growth yet
  EXPECT_EQ(sequence[2], 131072.0);
}

TEST(LossScaler, FiveThousandStepsWithDefaultGrowthInterval) {
  const auto fault_at = [](int64_t step) {
    if (step == 100 || step == 2501 || step == 4700) return Grad::Inf;
    if (step == 2500) return Grad::NaN;
    return Grad::Ok;
  };
  const auto sequence = run_against_reference(LossScalerOptions{}, 5000, fault_at);
  ASSERT_EQ(sequence.size(), 5000u);
  // Hand-checked milestones: halved at 100, doubled after the 2000 clean steps 101..2100, halved twice
  // at 2500/2501, doubled again after 2502..4501, halved at 4700.
  EXPECT_EQ(sequence[99], 65536.0);
  EXPECT_EQ(sequence[100], 32768.0);
  EXPECT_EQ(sequence[2099], 32768.0);
  EXPECT_EQ(sequence[2100], 65536.0);
  EXPECT_EQ(sequence[2501], 16384.0);
  EXPECT_EQ(sequence[4501], 32768.0);
  EXPECT_EQ(sequence[4700], 16384.0);
  EXPECT_EQ(sequence[4999], 16384.0);
}

// Debian's torch 1.13 has no CPU kernel for _amp_update_scale_ (nor for the fused unscale), so on a
// CPU-only machine the oracle reports itself skipped; on a GPU machine it replays the run with
// torch.cuda.amp.GradScaler.
TEST(LossScaler, SequenceMatchesTorchGradScaler) {
  LossScalerOptions options;
  options.growth_interval = 3;
  const auto sequence = run_against_reference(options, 5000, scripted_fault);
  ASSERT_EQ(sequence.size(), 5000u);
  ptrain::testing::TempDir dir;
  const std::string path = dir.file("sequence.txt");
  {
    std::ofstream out(path);
    out.precision(17);
    out << options.init_scale << ' ' << options.growth_factor << ' ' << options.backoff_factor << ' '
        << options.growth_interval << '\n';
    for (size_t step = 0; step < sequence.size(); ++step) {
      const Grad fault = scripted_fault(static_cast<int64_t>(step));
      out << (fault == Grad::Ok ? "ok" : fault == Grad::Inf ? "inf" : "nan") << ' ' << sequence[step] << '\n';
    }
  }
  const auto oracle = ptrain::testing::run_oracle("precision_gradscaler.py", path);
  if (oracle.exit_code == 77) GTEST_SKIP() << "torch's GradScaler has no CPU path in the oracle's torch and no CUDA device";
  EXPECT_EQ(oracle.exit_code, 0) << oracle.output;
}

// The CUDA path uses the fused kernels (_amp_foreach_non_finite_check_and_unscale_, _amp_update_scale_)
// and, with hysteresis, the tensor-op update on the device: both must follow the same reference.
TEST(LossScaler, CudaPathMatchesTheReference) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  LossScalerOptions options;
  options.growth_interval = 3;
  EXPECT_EQ(run_against_reference(options, 2000, scripted_fault, torch::kCUDA).size(), 2000u);
  options.hysteresis = 2;
  const auto runs = [](int64_t s) { return (s % 17) < (s / 17) % 5 ? Grad::Inf : Grad::Ok; };
  EXPECT_EQ(run_against_reference(options, 600, runs, torch::kCUDA).size(), 600u);
  options.consecutive_hysteresis = false;  // DeepSpeed's default, with a floor
  options.min_scale = 4096.0;
  EXPECT_EQ(run_against_reference(options, 600, runs, torch::kCUDA).size(), 600u);
  LossScalerOptions small;  // 2^10: randn * scale stays below float16's maximum, 65504
  small.init_scale = 1024.0;
  for (const auto dtype : {torch::kFloat, torch::kHalf, torch::kBFloat16}) {
    LossScaler scaler(small, torch::kCUDA);
    const auto truth = torch::randn({1000}, torch::kCUDA).to(dtype);
    std::vector<torch::Tensor> grads{(truth.to(torch::kDouble) * 1024.0).to(dtype)};
    scaler.unscale_(grads);
    EXPECT_EQ(scaler.found_inf().item<float>(), 0.0f);
    EXPECT_TRUE(torch::equal(grads[0], truth)) << c10::toString(dtype);
  }
}

#if PTRAIN_WITH_CUDA
// Capture refuses any host synchronisation (an .item() would abort it): a captured unscale_+update,
// replayed step after step with new gradient contents, must follow the reference like eager steps.
TEST(LossScaler, StepCapturesInACudaGraph) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (const int64_t hysteresis : {1, 2, -2}) {  // -2: hysteresis 2 refilled only on growth, with a floor
    SCOPED_TRACE("hysteresis " + std::to_string(hysteresis));
    LossScalerOptions options;
    options.growth_interval = 3;
    options.hysteresis = std::abs(hysteresis);
    options.consecutive_hysteresis = hysteresis > 0;
    if (hysteresis < 0) options.min_scale = 1024.0;
    LossScaler scaler(options, torch::kCUDA);
    const auto initial = scaler.state();
    auto g32 = torch::ones({64}, torch::kCUDA);
    auto g16 = torch::ones({64}, torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16));
    const std::vector<torch::Tensor> grads{g32, g16};
    at::cuda::CUDAGraph graph;
    {
      c10::cuda::CUDAStreamGuard side(c10::cuda::getStreamFromPool());
      scaler.unscale_(grads);  // warm-up outside capture: lazy initialisation must not happen inside
      scaler.update();
      torch::cuda::synchronize();
      scaler.load_state(initial);
      graph.capture_begin();
      scaler.unscale_(grads);
      scaler.update();
      graph.capture_end();
    }
    ReferenceScaler reference(options);
    for (int64_t step = 0; step < 200; ++step) {
      const Grad fault = (step % 17) < (step / 17) % 4 ? Grad::Inf : scripted_fault(step);
      g32.fill_(1.0);
      g16.fill_(fault == Grad::Inf ? INFINITY : fault == Grad::NaN ? NAN : 1.0);
      graph.replay();
      reference.step(fault != Grad::Ok);
      ASSERT_EQ(scaler.found_inf().item<float>(), fault == Grad::Ok ? 0.0f : 1.0f) << "step " << step;
      ASSERT_EQ(scaler.current_scale(), static_cast<double>(reference.scale)) << "step " << step;
    }
  }
}
#endif

TEST(LossScaler, UnscaleDividesExactlyInEveryDtype) {
  for (const auto dtype : {torch::kFloat, torch::kHalf, torch::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    LossScalerOptions options;
    options.init_scale = 1024.0;
    LossScaler scaler(options, torch::kCPU);
    torch::manual_seed(7);
    const std::vector<torch::Tensor> truth{torch::randn({16}).to(dtype), torch::randn({3, 3}).to(dtype)};
    std::vector<torch::Tensor> grads;
    for (const auto& t : truth) grads.push_back((t.to(torch::kDouble) * 1024.0).to(dtype));
    scaler.unscale_(grads);
    EXPECT_EQ(scaler.found_inf().item<float>(), 0.0f);
    for (size_t i = 0; i < grads.size(); ++i) {
      EXPECT_EQ(grads[i].scalar_type(), dtype);
      EXPECT_TRUE(torch::equal(grads[i], truth[i]));
    }
  }
}

TEST(LossScaler, UnscaleByANonPowerOfTwoMultipliesByTheRoundedReciprocal) {
  LossScalerOptions options;
  options.init_scale = 3.0;
  options.dynamic = false;
  LossScaler scaler(options, torch::kCPU);
  const std::vector<float> values{1.0f, -7.5f, 3.0f, 1e-3f, 12345.678f};
  std::vector<torch::Tensor> grads{torch::tensor(values)};
  scaler.unscale_(grads);
  const float inv = static_cast<float>(1.0 / 3.0);
  for (size_t i = 0; i < values.size(); ++i) {
    // float*float is exact in double; one rounding to float gives the correctly rounded product.
    const float expected = static_cast<float>(static_cast<double>(values[i]) * inv);
    EXPECT_EQ(grads[0][i].item<float>(), expected) << i;
  }
}

TEST(LossScaler, FoundInfFlagsAnyNonFiniteValueInAnyGradient) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const auto dtype : {torch::kFloat, torch::kHalf, torch::kBFloat16}) {
    for (const float bad : {inf, -inf, nan}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " " + std::to_string(bad));
      LossScaler scaler(LossScalerOptions{}, torch::kCPU);
      std::vector<torch::Tensor> grads{torch::ones({4}, dtype), torch::Tensor(), torch::ones({2, 3}, dtype),
                                       torch::ones({5}, torch::kFloat)};
      grads[2][1][2] = bad;
      scaler.unscale_(grads);
      EXPECT_EQ(scaler.found_inf().item<float>(), 1.0f);
    }
  }
  // Values that are merely large or tiny are finite.
  LossScaler scaler(LossScalerOptions{}, torch::kCPU);
  std::vector<torch::Tensor> grads{torch::tensor({65504.0f, -65504.0f}).to(torch::kHalf),
                                   torch::tensor({3e38f, 1e-45f})};
  scaler.unscale_(grads);
  EXPECT_EQ(scaler.found_inf().item<float>(), 0.0f);
}

TEST(LossScaler, SecondUnscaleInAStepDoesNothing) {
  LossScalerOptions options;
  options.init_scale = 4.0;
  LossScaler scaler(options, torch::kCPU);
  std::vector<torch::Tensor> grads{torch::full({3}, 8.0f)};
  scaler.unscale_(grads);
  scaler.unscale_(grads);
  EXPECT_TRUE(torch::equal(grads[0], torch::full({3}, 2.0f)));
  std::vector<torch::Tensor> late{torch::full({2}, std::numeric_limits<float>::infinity())};
  scaler.unscale_(late);
  EXPECT_EQ(scaler.found_inf().item<float>(), 0.0f);
  scaler.update();
  scaler.unscale_(late);  // a new step
  EXPECT_EQ(scaler.found_inf().item<float>(), 1.0f);
}

TEST(LossScaler, UpdateWithoutUnscaleIsRefused) {
  LossScaler scaler(LossScalerOptions{}, torch::kCPU);
  EXPECT_THROW(scaler.update(), ptrain::Error);
}

TEST(LossScaler, HysteresisTwoBacksOffOnlyOnTheSecondConsecutiveOverflow) {
  LossScalerOptions options;
  options.growth_interval = 3;
  options.hysteresis = 2;
  LossScaler scaler(options, torch::kCPU);
  auto step = [&](bool overflow) {
    std::vector<torch::Tensor> g{torch::full({2}, overflow ? std::numeric_limits<float>::infinity() : 1.0f)};
    scaler.unscale_(g);
    scaler.update();
    return scaler.current_scale();
  };
  EXPECT_EQ(step(true), 65536.0);   // first overflow: tolerated
  EXPECT_EQ(step(false), 65536.0);  // clean: refills the tolerance
  EXPECT_EQ(step(true), 65536.0);   // isolated again: tolerated
  EXPECT_EQ(step(true), 32768.0);   // second in a row: back off
  EXPECT_EQ(step(true), 16384.0);   // and every further one in the row
  EXPECT_EQ(step(false), 16384.0);
  EXPECT_EQ(step(false), 16384.0);
  EXPECT_EQ(step(false), 32768.0);  // three clean steps: grow

  // A longer run against the reference, with overflow runs of length 1..4.
  const auto fault_at = [](int64_t s) { return (s % 17) < (s / 17) % 5 ? Grad::Inf : Grad::Ok; };
  EXPECT_EQ(run_against_reference(options, 600, fault_at).size(), 600u);
}

TEST(LossScaler, MinScaleIsAFloor) {
  LossScalerOptions options;
  options.init_scale = 8.0;
  options.min_scale = 2.0;
  LossScaler scaler(options, torch::kCPU);
  for (double expected : {4.0, 2.0, 2.0, 2.0}) {
    std::vector<torch::Tensor> g{torch::full({1}, std::numeric_limits<float>::quiet_NaN())};
    scaler.unscale_(g);
    scaler.update();
    EXPECT_EQ(scaler.current_scale(), expected);
  }
}

// DeepSpeed's default (consecutive_hysteresis false): the tolerance refills only when the scale grows,
// so two isolated overflows within one growth interval back off.
TEST(LossScaler, HysteresisWithoutConsecutiveRefillsOnlyOnGrowth) {
  LossScalerOptions options;
  options.growth_interval = 3;
  options.hysteresis = 2;
  options.consecutive_hysteresis = false;
  LossScaler scaler(options, torch::kCPU);
  auto step = [&](Grad fault) {
    std::vector<torch::Tensor> g{torch::full({2}, 1.0f)};
    if (fault == Grad::Inf) g[0][0] = std::numeric_limits<float>::infinity();
    if (fault == Grad::NaN) g[0][1] = std::numeric_limits<float>::quiet_NaN();
    scaler.unscale_(g);
    scaler.update();
    return scaler.current_scale();
  };
  EXPECT_EQ(step(Grad::Inf), 65536.0);  // tolerated
  EXPECT_EQ(step(Grad::Ok), 65536.0);   // clean, but no refill
  EXPECT_EQ(step(Grad::NaN), 32768.0);  // isolated, yet the second since the last growth: back off
  EXPECT_EQ(step(Grad::Ok), 32768.0);
  EXPECT_EQ(step(Grad::Ok), 32768.0);
  EXPECT_EQ(step(Grad::Ok), 65536.0);   // grows and refills
  EXPECT_EQ(step(Grad::Inf), 65536.0);  // tolerated again
  EXPECT_EQ(step(Grad::Inf), 32768.0);

  const auto fault_at = [](int64_t s) { return s % 5 == 2 ? Grad::Inf : s % 11 == 4 ? Grad::NaN : Grad::Ok; };
  EXPECT_EQ(run_against_reference(options, 600, fault_at).size(), 600u);
}

// DeepSpeed's fp16 defaults (hysteresis 2, min_loss_scale 1) under injected infs and NaNs: the scale
// walks down to its floor and stays there, then grows back once the faults stop.
TEST(LossScaler, HysteresisTwoWithAMinimumScale) {
  LossScalerOptions options;
  options.init_scale = 16.0;
  options.growth_interval = 4;
  options.hysteresis = 2;
  options.min_scale = 2.0;
  for (const bool consecutive : {true, false}) {
    SCOPED_TRACE(consecutive ? "consecutive" : "refill on growth");
    options.consecutive_hysteresis = consecutive;
    LossScaler scaler(options, torch::kCPU);
    std::vector<double> sequence;
    for (int64_t s = 0; s < 16; ++s) {
      std::vector<torch::Tensor> g{torch::full({3}, 1.0f), torch::full({2}, 1.0f)};
      if (s < 8) g[s % 2][s % 2] = s % 3 == 0 ? std::numeric_limits<float>::quiet_NaN()
                                              : std::numeric_limits<float>::infinity();
      scaler.unscale_(g);
      EXPECT_EQ(scaler.found_inf().item<float>(), s < 8 ? 1.0f : 0.0f);
      scaler.update();
      sequence.push_back(scaler.current_scale());
    }
    // Eight overflows in a row: the first is tolerated, then halving to the floor 2 and staying there;
    // four clean steps grow it to 4, four more to 8.
    const std::vector<double> expected{16, 8, 4, 2, 2, 2, 2, 2, 2, 2, 2, 4, 4, 4, 4, 8};
    EXPECT_EQ(sequence, expected);
    const auto fault_at = [](int64_t s) { return s % 7 < 3 ? Grad::Inf : s % 13 == 5 ? Grad::NaN : Grad::Ok; };
    EXPECT_EQ(run_against_reference(options, 400, fault_at).size(), 400u);
  }
}

TEST(LossScaler, StaticScaleNeverChanges) {
  LossScalerOptions options;
  options.init_scale = 128.0;
  options.dynamic = false;
  options.growth_interval = 1;
  LossScaler scaler(options, torch::kCPU);
  for (int64_t step = 0; step < 50; ++step) {
    const bool overflow = step % 7 == 3;
    std::vector<torch::Tensor> g{torch::full({2}, overflow ? std::numeric_limits<float>::infinity() : 256.0f)};
    scaler.unscale_(g);
    EXPECT_EQ(scaler.found_inf().item<float>(), overflow ? 1.0f : 0.0f);
    if (!overflow) { EXPECT_TRUE(torch::equal(g[0], torch::full({2}, 2.0f))); }
    scaler.update();
    EXPECT_EQ(scaler.current_scale(), 128.0);
  }
}

TEST(LossScaler, DisabledScalerIsTheIdentity) {
  LossScalerOptions options;
  options.enabled = false;
  LossScaler scaler(options, torch::kCPU);
  const auto loss = torch::tensor(0.75f);
  EXPECT_TRUE(torch::equal(scaler.scale(loss), loss));
  std::vector<torch::Tensor> g{torch::full({2}, 3.0f)};
  scaler.unscale_(g);
  scaler.update();
  EXPECT_TRUE(torch::equal(g[0], torch::full({2}, 3.0f)));
}

TEST(LossScaler, ScaleMultipliesTheLossAndPromotesHalf) {
  LossScaler scaler(LossScalerOptions{}, torch::kCPU);
  const auto scaled = scaler.scale(torch::tensor(0.5f).to(torch::kHalf));
  EXPECT_EQ(scaled.scalar_type(), torch::kFloat);
  EXPECT_EQ(scaled.item<float>(), 32768.0f);
}

TEST(LossScaler, StateRoundTripContinuesTheSameSequence) {
  LossScalerOptions options;
  options.growth_interval = 5;
  options.hysteresis = 2;
  const auto fault_at = [](int64_t s) { return s % 11 == 4 || s % 11 == 5 ? Grad::Inf : Grad::Ok; };
  LossScaler original(options, torch::kCPU);
  auto step = [&](LossScaler& s, int64_t i) {
    std::vector<torch::Tensor> g{torch::full({1}, fault_at(i) == Grad::Inf ? INFINITY : 1.0f)};
    s.unscale_(g);
    s.update();
  };
  for (int64_t i = 0; i < 37; ++i) step(original, i);  // mid-way through a growth interval

  LossScalerOptions other = options;
  other.init_scale = 2.0;
  LossScaler restored(other, torch::kCPU);
  restored.load_state(original.state());
  EXPECT_EQ(restored.current_scale(), original.current_scale());
  for (int64_t i = 37; i < 100; ++i) {
    step(original, i);
    step(restored, i);
    ASSERT_EQ(restored.current_scale(), original.current_scale()) << "step " << i;
  }
  const auto a = original.state();
  const auto b = restored.state();
  ASSERT_EQ(a.size(), 3u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;
  }
}

TEST(LossScaler, BadStateIsRefused) {
  LossScaler scaler(LossScalerOptions{}, torch::kCPU);
  const auto good = scaler.state();
  auto without = [&](const std::string& name) {
    auto s = good;
    s.erase(std::remove_if(s.begin(), s.end(), [&](const auto& e) { return e.first == name; }), s.end());
    return s;
  };
  auto with = [&](const std::string& name, torch::Tensor t) {
    auto s = without(name);
    s.emplace_back(name, t);
    return s;
  };
  auto expect_error = [&](const std::vector<std::pair<std::string, torch::Tensor>>& s, const std::string& fragment) {
    try {
      scaler.load_state(s);
      ADD_FAILURE() << "accepted state lacking/with bad " << fragment;
    } catch (const ptrain::Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_error(without("growth_tracker"), "growth_tracker");
  expect_error(with("colour", torch::tensor(1.0f)), "colour");
  expect_error(with("scale", torch::tensor(0.0f)), "scale");
  expect_error(with("scale", torch::tensor(-4.0f)), "scale");
  expect_error(with("scale", torch::tensor(INFINITY)), "scale");
  expect_error(with("scale", torch::ones({2})), "scale");
  EXPECT_EQ(scaler.current_scale(), 65536.0);  // a refused state leaves the scaler as it was
}

TEST(LossScaler, BadOptionsAreRefused) {
  auto refused = [](auto mutate) {
    LossScalerOptions o;
    mutate(o);
    EXPECT_THROW(LossScaler(o, torch::kCPU), ptrain::Error);
  };
  refused([](LossScalerOptions& o) { o.init_scale = 0.0; });
  refused([](LossScalerOptions& o) { o.growth_factor = 1.0; });
  refused([](LossScalerOptions& o) { o.backoff_factor = 1.0; });
  refused([](LossScalerOptions& o) { o.growth_interval = 0; });
  refused([](LossScalerOptions& o) { o.hysteresis = 0; });
  refused([](LossScalerOptions& o) { o.min_scale = 1e9; });
}

TEST(LossScaler, OptionsFollowThePolicy) {
  using ptrain::precision::resolve_precision;
  const auto dynamic = ptrain::precision::loss_scaler_options(resolve_precision("amp-fp16", false, c10::kCUDA));
  EXPECT_TRUE(dynamic.enabled && dynamic.dynamic);
  EXPECT_EQ(dynamic.init_scale, 65536.0);
  const auto fixed = ptrain::precision::loss_scaler_options(resolve_precision("fp16", true, c10::kCUDA, "512"));
  EXPECT_TRUE(fixed.enabled);
  EXPECT_FALSE(fixed.dynamic);
  EXPECT_EQ(fixed.init_scale, 512.0);
  EXPECT_FALSE(ptrain::precision::loss_scaler_options(resolve_precision("bf16", false, c10::kCPU)).enabled);

  // The dynamic scale's rules travel in the policy (DeepSpeed's fp16 block sets them).
  auto policy = resolve_precision("fp16", true, c10::kCUDA);
  policy.initial_loss_scale = 4096;
  policy.loss_scale_window = 1000;
  policy.hysteresis = 2;
  policy.consecutive_hysteresis = false;
  policy.min_loss_scale = 1;
  const auto deepspeed = ptrain::precision::loss_scaler_options(policy);
  EXPECT_TRUE(deepspeed.dynamic);
  EXPECT_EQ(deepspeed.init_scale, 4096.0);
  EXPECT_EQ(deepspeed.growth_interval, 1000);
  EXPECT_EQ(deepspeed.hysteresis, 2);
  EXPECT_FALSE(deepspeed.consecutive_hysteresis);
  EXPECT_EQ(deepspeed.min_scale, 1.0);
}
