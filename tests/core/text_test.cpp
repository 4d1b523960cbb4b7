#include "ptrain/core/text.h"

#include <gtest/gtest.h>

namespace ptrain {
namespace {

TEST(Text, EndsWith) {
  EXPECT_TRUE(ends_with("resnet.pt", ".pt"));
  EXPECT_TRUE(ends_with(".pt", ".pt"));
  EXPECT_TRUE(ends_with("anything", ""));
  EXPECT_FALSE(ends_with("pt", ".pt"));
  EXPECT_FALSE(ends_with("model.pth", ".pt"));
}

// A suffix is cut only from a longer text: "+offload" alone is no strategy with its optimizer offloaded.
TEST(Text, RemoveSuffixCutsOnlyFromALongerText) {
  std::string strategy = "zero2+offload";
  EXPECT_TRUE(remove_suffix(strategy, "+offload"));
  EXPECT_EQ(strategy, "zero2");
  EXPECT_FALSE(remove_suffix(strategy, "+offload"));
  EXPECT_EQ(strategy, "zero2");
  std::string alone = "Impl";
  EXPECT_FALSE(remove_suffix(alone, "Impl"));
  EXPECT_EQ(alone, "Impl");
  std::string other = "fp16+master";
  EXPECT_FALSE(remove_suffix(other, "+channels-last"));
  EXPECT_EQ(other, "fp16+master");
}

}  // namespace
}  // namespace ptrain
