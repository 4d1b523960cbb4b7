// What a person watching a run sees: a live bar on a terminal, plain lines in logs and pipes. Like the
// scalar logs, the lines are auxiliary: stdout that cannot be written (a full disk) warns once on stderr,
// and the run goes on without them.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace ptrain::train {

class Progress {
 public:
  enum class Style { Bar, Lines, None };
  // "auto" picks Bar when stdout is a terminal, Lines otherwise.
  static Style style_from(const std::string& name);

  Progress(Style style, int64_t epochs, int64_t steps_per_epoch);

  void start_epoch(int64_t epoch);
  // A language model's run: update() says tokens/s (samples/s x seq_len), as its record does, not img/s.
  void count_tokens(int64_t seq_len) { tokens_per_sample_ = seq_len; }
  // step: optimizer steps done in this epoch; samples_per_second: images or sequences; loss: mean over the
  // steps since the last update; mfu: the model FLOP utilisation over those steps, where the run knows it
  // (metrics/flops.h).
  void update(int64_t step, double samples_per_second, double loss, std::optional<double> mfu = std::nullopt);
  void end_epoch(const std::string& summary);
  void message(const std::string& text);

 private:
  // After each write: a failed one gives the lines up, with one warning naming the OS's reason.
  void give_up_unless_written();

  Style style_;
  int64_t epochs_, steps_per_epoch_;
  int64_t epoch_ = 0;
  int64_t tokens_per_sample_ = 0;  // 0: images
  std::chrono::steady_clock::time_point epoch_start_;
  bool bar_open_ = false;
};

std::string format_duration(double seconds);

// "812 img/s", or for a language model's sequences of seq_len tokens "25984 tokens/s" (seq_len 0: images).
std::string throughput_text(double samples_per_second, int64_t seq_len);

}  // namespace ptrain::train
