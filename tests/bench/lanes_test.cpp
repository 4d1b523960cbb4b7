// The bench's scheduling: runs side by side only where each has GPUs of its own, in order, and a run
// that must be alone is alone.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <thread>

#include "ptrain/bench/lanes.h"

namespace ptrain::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Span {
  Clock::time_point start, end;
  std::vector<int64_t> gpus;
  bool ran = false;
};

std::vector<Span> run(int64_t gpus, const std::vector<int64_t>& needs, int stop_at = -1, bool* all_ran = nullptr) {
  std::vector<Span> spans(needs.size());
  std::mutex mutex;
  const bool ran_all = run_in_lanes(gpus, needs, [&](size_t i, const std::vector<int64_t>& given) {
    const auto start = Clock::now();
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    std::lock_guard<std::mutex> lock(mutex);
    spans[i] = {start, Clock::now(), given, true};
    return static_cast<int>(i) != stop_at;
  });
  if (all_ran) *all_ran = ran_all;
  return spans;
}

bool overlap(const Span& a, const Span& b) { return a.start < b.end && b.start < a.end; }

TEST(Lanes, OneGpuRunsShareTwoGpusAndAWholeMachineRunWaitsForBoth) {
  const auto s = run(2, {1, 1, 2, 1});
  for (const auto& span : s) ASSERT_TRUE(span.ran);
  EXPECT_TRUE(overlap(s[0], s[1]));
  EXPECT_EQ(s[0].gpus, std::vector<int64_t>{0});
  EXPECT_EQ(s[1].gpus, std::vector<int64_t>{1});
  EXPECT_EQ(s[2].gpus, (std::vector<int64_t>{0, 1}));
  EXPECT_GE(s[2].start, s[0].end);
  EXPECT_GE(s[2].start, s[1].end);
  EXPECT_GE(s[3].start, s[2].end) << "a later run must not overtake the one that waits";
}

TEST(Lanes, RunsAskingForNoGpuOrTooManyRunAlone) {
  const auto s = run(2, {1, 0, 1, 3, 1});
  EXPECT_FALSE(overlap(s[0], s[1]));
  EXPECT_FALSE(overlap(s[1], s[2]));
  EXPECT_FALSE(overlap(s[3], s[2]));
  EXPECT_FALSE(overlap(s[3], s[4]));
  EXPECT_TRUE(s[1].gpus.empty());
}

TEST(Lanes, ATaskThatStopsSkipsTheRest) {
  bool all_ran = true;
  const auto s = run(1, {1, 1, 1}, /*stop_at=*/1, &all_ran);
  EXPECT_FALSE(all_ran);
  EXPECT_TRUE(s[0].ran);
  EXPECT_TRUE(s[1].ran);
  EXPECT_FALSE(s[2].ran);
}

}  // namespace
}  // namespace ptrain::bench
