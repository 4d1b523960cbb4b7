// What a person watching a run sees: a live bar on a terminal, plain lines in logs and pipes.
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
  // step: optimizer steps done in this epoch; loss: mean over the steps since the last update; mfu: the model
  // FLOP utilisation over those steps, where the run knows it (metrics/flops.h).
  void update(int64_t step, double images_per_second, double loss, std::optional<double> mfu = std::nullopt);
  void end_epoch(const std::string& summary);
  void message(const std::string& text);

 private:
  Style style_;
  int64_t epochs_, steps_per_epoch_;
  int64_t epoch_ = 0;
  std::chrono::steady_clock::time_point epoch_start_;
  bool bar_open_ = false;
};

std::string format_duration(double seconds);

}  // namespace ptrain::train
