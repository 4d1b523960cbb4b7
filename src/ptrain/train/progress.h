// What a person watching a run sees: a live bar on a terminal, plain lines in logs and pipes. Like the
// scalar logs, the lines are auxiliary: stdout that cannot be written (a full disk) warns once on stderr,
// and the run goes on without them.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace ptrain::train {

class Progress {
 public:
  enum class Style { Bar, Lines, None };
  // "auto" picks Bar when stdout is a terminal, Lines otherwise.
  static Style style_from(const std::string& name);

  Progress(Style style, int64_t epochs, int64_t steps_per_epoch);

  void start_epoch(int64_t epoch);
  // step: optimizer steps done in this epoch; loss: mean over the steps since the last update.
  void update(int64_t step, double images_per_second, double loss);
  void end_epoch(const std::string& summary);
  void message(const std::string& text);

 private:
  // After each write: a failed one gives the lines up, with one warning naming the OS's reason.
  void give_up_unless_written();

  Style style_;
  int64_t epochs_, steps_per_epoch_;
  int64_t epoch_ = 0;
  std::chrono::steady_clock::time_point epoch_start_;
  bool bar_open_ = false;
};

std::string format_duration(double seconds);

}  // namespace ptrain::train
