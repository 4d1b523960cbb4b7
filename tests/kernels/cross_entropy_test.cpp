// The fused cross-entropy against LibTorch's (fp32 cross_entropy and argmax): loss, correct count and the
// gradient, in every dtype, for odd shapes, strided rows and GPT-2's vocabulary.
#include <gtest/gtest.h>

#include <limits>

#include "gpu.h"
#include "ptrain/kernels/cross_entropy.h"

namespace {

using ptrain::kernels::cross_entropy;
using ptrain::kernels::Reduction;
using ptrain::kernels::reference_cross_entropy;

struct Case {
  int64_t rows, classes;
  torch::ScalarType dtype;
};

std::string name_of(const Case& c) {
  return std::to_string(c.rows) + "x" + std::to_string(c.classes) + " " + c10::toString(c.dtype);
}

// Compares one case on fresh random data: loss, count, and the gradient of loss * g for a random g.
void compare(const Case& c, Reduction reduction, bool strided) {
  const torch::Device cuda(torch::kCUDA, 0);
  auto wide = (torch::randn({c.rows, c.classes + (strided ? 7 : 0)}, torch::dtype(torch::kFloat).device(cuda)) * 3)
                  .to(c.dtype);
  auto logits_data = strided ? wide.narrow(1, 3, c.classes) : wide;
  const auto labels = torch::randint(c.classes, {c.rows}, torch::dtype(torch::kInt64).device(cuda));
  const double g = 0.75;

  auto fused_in = logits_data.detach().clone().requires_grad_(true);
  auto fused_view = strided ? fused_in : fused_in;
  ASSERT_TRUE(ptrain::kernels::fused_cross_entropy_applies(fused_view)) << name_of(c);
  auto fused = cross_entropy(fused_view, labels, reduction, /*allow_fused=*/true);
  (fused.loss * g).backward();

  auto ref_in = logits_data.detach().clone().requires_grad_(true);
  auto ref = reference_cross_entropy(ref_in, labels, reduction);
  (ref.loss * g).backward();

  const std::string what = name_of(c) + (strided ? " strided" : "") + (reduction == Reduction::kMean ? " mean" : " sum");
  EXPECT_EQ(fused.loss.scalar_type(), torch::kFloat) << what;
  EXPECT_LT(relative_error(fused.loss, ref.loss), 1e-5) << what;
  EXPECT_EQ(fused.correct.item<double>(), ref.correct.item<double>()) << what;
  ASSERT_TRUE(fused_in.grad().defined()) << what;
  EXPECT_EQ(fused_in.grad().scalar_type(), c.dtype) << what;
  // The reference's gradient is computed in fp32 and rounded once to the dtype, as the kernel's is.
  const double tolerance = c.dtype == torch::kFloat ? 1e-5 : c.dtype == torch::kHalf ? 2e-3 : 1e-2;
  EXPECT_LT(relative_error(fused_in.grad(), ref_in.grad()), tolerance) << what;
}

TEST(FusedCrossEntropy, MatchesLibTorchInEveryDtypeAndShape) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  torch::manual_seed(3);
  for (const auto dtype : {torch::kFloat, torch::kHalf, torch::kBFloat16}) {
    for (const Case c : {Case{1, 2, dtype}, Case{7, 10, dtype}, Case{33, 1000, dtype}, Case{129, 4097, dtype},
                         Case{64, 50257, dtype}}) {
      for (const auto reduction : {Reduction::kMean, Reduction::kSum}) compare(c, reduction, /*strided=*/false);
      compare(c, Reduction::kMean, /*strided=*/true);
    }
  }
}

TEST(FusedCrossEntropy, GptTwoSmallBatchOfRows) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  torch::manual_seed(4);
  compare({16 * 1024, 50257, torch::kBFloat16}, Reduction::kMean, /*strided=*/false);
}

TEST(FusedCrossEntropy, PaddedVocabularyReadsOnlyTheClassesAndZeroesThePaddingsGradient) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  torch::manual_seed(6);
  const torch::Device cuda(torch::kCUDA, 0);
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const int64_t rows = 37, classes = 1001, width = 1024;
    auto padded = (torch::randn({rows, width}, torch::device(cuda)) * 2).to(dtype).requires_grad_(true);
    const auto labels = torch::randint(classes, {rows}, torch::dtype(torch::kInt64).device(cuda));
    auto fused = cross_entropy(padded, labels, Reduction::kMean, true, classes);
    fused.loss.backward();
    auto exact = padded.detach().narrow(1, 0, classes).clone().requires_grad_(true);
    auto ref = reference_cross_entropy(exact, labels, Reduction::kMean);
    ref.loss.backward();
    EXPECT_LT(relative_error(fused.loss, ref.loss), 1e-5);
    EXPECT_EQ(fused.correct.item<double>(), ref.correct.item<double>());
    ASSERT_EQ(padded.grad().sizes(), padded.sizes());
    EXPECT_LT(relative_error(padded.grad().narrow(1, 0, classes), exact.grad()), dtype == torch::kFloat ? 1e-5 : 1e-2);
    EXPECT_EQ(padded.grad().narrow(1, classes, width - classes).abs().max().item<double>(), 0.0);
  }
}

TEST(FusedCrossEntropy, TiesCountTheFirstLargestLikeArgmax) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  const torch::Device cuda(torch::kCUDA, 0);
  // Row 0: the label holds the first of two equal maxima (correct); row 1: the second (not correct).
  auto logits = torch::tensor({{0.0f, 5.0f, 5.0f, 1.0f}, {0.0f, 5.0f, 5.0f, 1.0f}}, torch::device(cuda));
  const auto labels = torch::tensor({int64_t{1}, int64_t{2}}, torch::dtype(torch::kInt64).device(cuda));
  const auto fused = cross_entropy(logits, labels, Reduction::kSum, true);
  const auto ref = reference_cross_entropy(logits, labels, Reduction::kSum);
  EXPECT_EQ(fused.correct.item<double>(), 1.0);
  EXPECT_EQ(ref.correct.item<double>(), 1.0);
}

TEST(FusedCrossEntropy, NonFiniteLogitsAndBadLabelsGiveNaNNotSilence) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  const torch::Device cuda(torch::kCUDA, 0);
  auto logits = torch::randn({3, 50}, torch::device(cuda));
  logits[1][7] = std::numeric_limits<float>::quiet_NaN();
  const auto labels = torch::tensor({int64_t{0}, int64_t{1}, int64_t{2}}, torch::dtype(torch::kInt64).device(cuda));
  EXPECT_TRUE(std::isnan(cross_entropy(logits, labels, Reduction::kMean, true).loss.item<double>()));

  const auto clean = torch::randn({3, 50}, torch::device(cuda));
  const auto out_of_range = torch::tensor({int64_t{0}, int64_t{50}, int64_t{2}}, torch::dtype(torch::kInt64).device(cuda));
  EXPECT_TRUE(std::isnan(cross_entropy(clean, out_of_range, Reduction::kMean, true).loss.item<double>()));
}

TEST(FusedCrossEntropy, CpuTensorsTakeTheReferencePath) {
  // Runs everywhere: on the CPU the public function is LibTorch's cross_entropy and argmax.
  torch::manual_seed(5);
  auto logits = torch::randn({9, 13}).requires_grad_(true);
  const auto labels = torch::randint(13, {9}, torch::kInt64);
  EXPECT_FALSE(ptrain::kernels::fused_cross_entropy_applies(logits));
  const auto got = cross_entropy(logits, labels, Reduction::kMean, true);
  const auto want = torch::nn::functional::cross_entropy(logits, labels);
  EXPECT_TRUE(torch::allclose(got.loss, want));
  EXPECT_EQ(got.correct.item<double>(), logits.argmax(1).eq(labels).sum().item<double>());
}

}  // namespace
