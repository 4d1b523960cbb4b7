// The tensors that tests/oracles/safetensors_oracle.py expected_tensors() builds, from the same formulas
// (values exact in their dtypes, so equality is exact).
#pragma once

#include <torch/torch.h>

#include "ptrain/io/named_tensors.h"

namespace ptrain::testing {

inline io::NamedTensors expected_tensors() {
  auto arange = [](int64_t n, c10::ScalarType type) { return torch::arange(n, torch::dtype(type)); };
  io::NamedTensors t;
  t.emplace_back("f64", arange(6, torch::kDouble).reshape({2, 3}) / 4 - 1);
  t.emplace_back("f32", arange(24, torch::kFloat).reshape({2, 3, 4}) * 0.5 - 3);
  t.emplace_back("f16", (arange(10, torch::kFloat) * 0.25).to(torch::kHalf));
  t.emplace_back("bf16", (arange(8, torch::kFloat) * 0.5 - 2).to(torch::kBFloat16));
  t.emplace_back("i64", arange(5, torch::kLong) * (int64_t{1} << 40) - 7);
  t.emplace_back("i32", arange(6, torch::kInt).reshape({3, 2}) * -100000);
  t.emplace_back("i16", arange(4, torch::kShort) * -300);
  t.emplace_back("i8", torch::arange(-4, 4, torch::dtype(torch::kChar)));
  t.emplace_back("u8", torch::arange(250, 256, torch::dtype(torch::kByte)));
  t.emplace_back("bool", torch::arange(5).remainder(2) == 0);
  t.emplace_back("scalar", torch::tensor(3.5f));
  t.emplace_back("empty", torch::zeros({0, 3}));
  t.emplace_back("transposed", arange(12, torch::kFloat).reshape({3, 4}).t());  // non-contiguous on purpose
  return t;
}

inline void expect_same_tensors(const io::NamedTensors& actual, const io::NamedTensors& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    const auto& [name, tensor] = expected[i];
    EXPECT_EQ(actual[i].first, name) << "at position " << i;
    EXPECT_EQ(actual[i].second.scalar_type(), tensor.scalar_type()) << name;
    EXPECT_EQ(actual[i].second.sizes(), tensor.sizes()) << name;
    if (actual[i].second.scalar_type() == tensor.scalar_type() && actual[i].second.sizes() == tensor.sizes()) {
      EXPECT_TRUE(torch::equal(actual[i].second, tensor)) << name << ": " << actual[i].second << " vs " << tensor;
    }
  }
}

}  // namespace ptrain::testing
