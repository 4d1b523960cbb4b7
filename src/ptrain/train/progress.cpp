#include "ptrain/train/progress.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>

namespace ptrain::train {

Progress::Style Progress::style_from(const std::string& name) {
  if (name == "bar") return Style::Bar;
  if (name == "lines") return Style::Lines;
  if (name == "none") return Style::None;
  return isatty(STDOUT_FILENO) ? Style::Bar : Style::Lines;
}

Progress::Progress(Style style, int64_t epochs, int64_t steps_per_epoch)
    : style_(style), epochs_(epochs), steps_per_epoch_(steps_per_epoch) {}

std::string format_duration(double seconds) {
  const long total = static_cast<long>(seconds + 0.5);
  char text[32];
  if (total >= 3600) {
    std::snprintf(text, sizeof(text), "%ld:%02ld:%02ld", total / 3600, (total / 60) % 60, total % 60);
  } else {
    std::snprintf(text, sizeof(text), "%02ld:%02ld", total / 60, total % 60);
  }
  return text;
}

std::string throughput_text(double samples_per_second, int64_t seq_len) {
  char text[48];
  if (seq_len > 0) {
    std::snprintf(text, sizeof(text), "%.0f tokens/s", samples_per_second * static_cast<double>(seq_len));
  } else {
    std::snprintf(text, sizeof(text), "%.0f img/s", samples_per_second);
  }
  return text;
}

void Progress::start_epoch(int64_t epoch) {
  epoch_ = epoch;
  epoch_start_ = std::chrono::steady_clock::now();
}

void Progress::update(int64_t step, double samples_per_second, double loss, std::optional<double> mfu) {
  if (style_ == Style::None) return;
  std::string throughput = throughput_text(samples_per_second, tokens_per_sample_);
  if (mfu) {
    char utilisation[32];
    std::snprintf(utilisation, sizeof(utilisation), "  mfu %.1f%%", *mfu * 100.0);
    throughput += utilisation;
  }
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start_).count();
  const double eta = step > 0 ? elapsed / static_cast<double>(step) * static_cast<double>(steps_per_epoch_ - step) : 0;
  char line[256];
  if (style_ == Style::Bar) {
    constexpr int kWidth = 28;
    const int filled = steps_per_epoch_ > 0 ? static_cast<int>(kWidth * step / steps_per_epoch_) : 0;
    std::string bar(static_cast<size_t>(filled), '#');
    bar.append(static_cast<size_t>(kWidth - filled), '.');
    std::snprintf(line, sizeof(line), "\repoch %lld/%lld [%s] %lld/%lld  %s  loss %.4f  ETA %s   ",
                  static_cast<long long>(epoch_ + 1), static_cast<long long>(epochs_), bar.c_str(),
                  static_cast<long long>(step), static_cast<long long>(steps_per_epoch_), throughput.c_str(), loss,
                  format_duration(eta).c_str());
    std::cout << line << std::flush;
    bar_open_ = true;
    give_up_unless_written();
  } else {
    std::snprintf(line, sizeof(line), "epoch %lld/%lld step %lld/%lld  %s  loss %.4f  eta %s",
                  static_cast<long long>(epoch_ + 1), static_cast<long long>(epochs_), static_cast<long long>(step),
                  static_cast<long long>(steps_per_epoch_), throughput.c_str(), loss, format_duration(eta).c_str());
    std::cout << line << std::endl;
    give_up_unless_written();
  }
}

void Progress::end_epoch(const std::string& summary) { message(summary); }

void Progress::message(const std::string& text) {
  if (style_ == Style::None) return;
  if (bar_open_) {
    std::cout << "\n";
    bar_open_ = false;
  }
  std::cout << text << std::endl;
  give_up_unless_written();
}

void Progress::give_up_unless_written() {
  if (std::cout.good()) return;
  const int error = errno;
  std::cout.clear();  // the run's own lines after it (its result) may still get through
  style_ = Style::None;
  std::cerr << "ptrain: warning: the progress lines cannot be written to stdout (" << std::strerror(error)
            << "); training goes on without them" << std::endl;
}

}  // namespace ptrain::train
