// What each process of a job prints: with several ranks, rank 0 alone speaks (the plan, progress,
// results), as torchrun users expect; the other ranks keep their errors and drop the rest, unless the
// run asks for every rank's output (--log-all-ranks).
#pragma once

#include <iosfwd>
#include <memory>
#include <streambuf>

namespace ptrain::cli {

class RankOutput {
 public:
  // Quiets this process's std::cout, and the lines of std::cerr that are not errors, when quiet.
  explicit RankOutput(bool quiet);
  ~RankOutput();
  RankOutput(const RankOutput&) = delete;
  RankOutput& operator=(const RankOutput&) = delete;

 private:
  std::unique_ptr<std::streambuf> dropped_, errors_only_;
  std::streambuf* cout_ = nullptr;
  std::streambuf* cerr_ = nullptr;
};

}  // namespace ptrain::cli
