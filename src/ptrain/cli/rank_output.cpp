#include "ptrain/cli/rank_output.h"

#include <iostream>
#include <string>

namespace ptrain::cli {

namespace {

class Dropped : public std::streambuf {
 protected:
  int overflow(int ch) override { return traits_type::not_eof(ch); }
  std::streamsize xsputn(const char*, std::streamsize n) override { return n; }
};

// Passes whole lines to target except warnings and notes: a rank's "ptrain: error:" lines, LibTorch's
// errors and anything unforeseen still show.
class ErrorsOnly : public std::streambuf {
 public:
  explicit ErrorsOnly(std::streambuf* target) : target_(target) {}
  ~ErrorsOnly() override { flush_line(); }

 protected:
  int overflow(int ch) override {
    if (ch == traits_type::eof()) return traits_type::not_eof(ch);
    line_ += static_cast<char>(ch);
    if (ch == '\n') flush_line();
    return ch;
  }
  int sync() override {
    // std::endl syncs after the newline; a partial line waits for its end.
    return target_->pubsync();
  }

 private:
  void flush_line() {
    if (line_.empty()) return;
    if (line_.rfind("ptrain: warning:", 0) != 0) target_->sputn(line_.data(), static_cast<std::streamsize>(line_.size()));
    line_.clear();
  }
  std::streambuf* target_;
  std::string line_;
};

}  // namespace

RankOutput::RankOutput(bool quiet) {
  if (!quiet) return;
  dropped_ = std::make_unique<Dropped>();
  errors_only_ = std::make_unique<ErrorsOnly>(std::cerr.rdbuf());
  cout_ = std::cout.rdbuf(dropped_.get());
  cerr_ = std::cerr.rdbuf(errors_only_.get());
}

RankOutput::~RankOutput() {
  if (cout_ != nullptr) std::cout.rdbuf(cout_);
  if (cerr_ != nullptr) std::cerr.rdbuf(cerr_);
  errors_only_.reset();  // writes a last line left without its newline
}

}  // namespace ptrain::cli
