#include "ptrain/bench/report.h"

#include <unistd.h>

#include <algorithm>
#include <tuple>
#include <charconv>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "ptrain/core/error.h"

namespace ptrain::bench {
namespace {

namespace fs = std::filesystem;
using metrics::RunRecord;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr char kNotAvailable[] = "n/a";

// ---------------------------------------------------------------------------------------------------
// Values: a record keeps unmeasured numbers as nullopt or NaN (a JSON null read into a required double);
// the report treats both as missing.

std::optional<double> measured(double value) {
  return std::isfinite(value) ? std::optional<double>(value) : std::nullopt;
}
std::optional<double> measured(std::optional<double> value) { return value ? measured(*value) : std::nullopt; }
std::optional<double> measured(std::optional<int64_t> value) {
  return value ? std::optional<double>(static_cast<double>(*value)) : std::nullopt;
}

std::string printf_string(const char* format, double value) {
  char text[64];
  std::snprintf(text, sizeof(text), format, value);
  return text;
}

std::string shortest_number(double value) {
  char text[64];
  const auto result = std::to_chars(text, text + sizeof(text), value);
  return std::string(text, result.ptr);
}

std::string gib_text(std::optional<double> bytes) {
  return bytes ? printf_string("%.2f GiB", *bytes / kGiB) : kNotAvailable;
}

std::string duration_text(std::optional<double> seconds) {
  if (!seconds) return kNotAvailable;
  if (*seconds < 60.0) return printf_string("%.1f s", *seconds);
  const auto whole = static_cast<long long>(std::llround(*seconds));
  char text[64];
  if (whole < 3600) {
    std::snprintf(text, sizeof(text), "%lld min %02lld s", whole / 60, whole % 60);
  } else {
    std::snprintf(text, sizeof(text), "%lld h %02lld min", whole / 3600, (whole % 3600) / 60);
  }
  return text;
}

std::string percent_text(std::optional<double> percent, const char* format = "%.0f%%") {
  return percent ? printf_string(format, *percent) : kNotAvailable;
}

std::string fraction_as_percent_text(std::optional<double> fraction) {
  return fraction ? printf_string("%.2f%%", *fraction * 100.0) : kNotAvailable;
}

std::string throughput_text(std::optional<double> images_per_second) {
  if (!images_per_second) return kNotAvailable;
  return printf_string(*images_per_second < 100.0 ? "%.1f" : "%.0f", *images_per_second);
}

std::string csv_number(std::optional<double> value) { return value ? shortest_number(*value) : ""; }

std::string framework_display_name(const std::string& framework) {
  return framework == metrics::kFrameworkPytorch ? "PyTorch" : framework;
}

bool is_single_device_fp32_ptrain(const RunRecord& r) {
  return r.framework == metrics::kFrameworkPtrain && r.strategy == "single" && r.precision == "fp32" &&
         r.devices == 1;
}

// ---------------------------------------------------------------------------------------------------
// The table: one column list for report.md, report.csv and report.html, so the three cannot disagree.

struct Column {
  const char* title;     // report.md and report.html
  const char* csv_name;  // report.csv: plain units in the name, as in the run record
  bool numeric;
  std::function<std::string(const Report&, size_t)> text;
  std::function<std::string(const Report&, size_t)> csv;
};

const RunRecord& record_of(const Report& report, size_t run) { return report.runs[run].record; }

// What `ptrain estimate` predicted for the run before it ran (ptrain bench puts it in the record's extra).
std::optional<double> predicted_peak(const RunRecord& r) {
  const auto estimate = r.extra.find("estimate");
  if (estimate == r.extra.end() || !estimate->is_object()) return std::nullopt;
  const auto bytes = estimate->find("predicted_peak_allocated_bytes");
  if (bytes == estimate->end() || !bytes->is_number()) return std::nullopt;
  return bytes->get<double>();
}

const std::vector<Column>& columns() {
  static const std::vector<Column> all = [] {
    std::vector<Column> c;
    const auto same = [](auto get) {
      return std::make_pair(std::function<std::string(const Report&, size_t)>(get),
                            std::function<std::string(const Report&, size_t)>(get));
    };
    const auto add = [&](const char* title, const char* csv_name, bool numeric, auto text_and_csv) {
      c.push_back({title, csv_name, numeric, text_and_csv.first, text_and_csv.second});
    };
    const auto number = [](auto get, auto format) {
      return std::make_pair(
          std::function<std::string(const Report&, size_t)>(
              [get, format](const Report& r, size_t i) { return format(get(r, i)); }),
          std::function<std::string(const Report&, size_t)>(
              [get](const Report& r, size_t i) { return csv_number(get(r, i)); }));
    };
    add("run", "run", false, same([](const Report& r, size_t i) { return r.runs[i].name; }));
    add("framework", "framework", false,
        same([](const Report& r, size_t i) { return record_of(r, i).framework; }));
    add("strategy", "strategy", false, same([](const Report& r, size_t i) { return record_of(r, i).strategy; }));
    add("precision", "precision", false,
        same([](const Report& r, size_t i) { return record_of(r, i).precision; }));
    add("devices", "devices", true,
        same([](const Report& r, size_t i) { return std::to_string(record_of(r, i).devices); }));
    add("batch/device", "batch_size_per_device", true,
        same([](const Report& r, size_t i) { return std::to_string(record_of(r, i).batch_size_per_device); }));
    add("peak allocated/GPU", "peak_allocated_bytes_per_gpu", true,
        number([](const Report& r, size_t i) { return measured(record_of(r, i).peak_allocated_bytes); },
               gib_text));
    add("predicted peak/GPU", "predicted_peak_allocated_bytes_per_gpu", true,
        number([](const Report& r, size_t i) { return predicted_peak(record_of(r, i)); }, gib_text));
    add("peak NVML used/GPU", "peak_nvml_used_bytes_per_gpu", true,
        number([](const Report& r, size_t i) { return measured(record_of(r, i).peak_nvml_used_bytes); },
               gib_text));
    add("GPU util mean", "gpu_util_mean_percent", true,
        number([](const Report& r, size_t i) { return measured(record_of(r, i).gpu_util_mean); },
               [](std::optional<double> v) { return percent_text(v); }));
    add("GPU util peak", "gpu_util_peak_percent", true,
        number([](const Report& r, size_t i) { return measured(record_of(r, i).gpu_util_peak); },
               [](std::optional<double> v) { return percent_text(v); }));
    add("total time", "total_wall_seconds", true,
        number([](const Report& r, size_t i) { return measured(record_of(r, i).total_wall_seconds); },
               duration_text));
    add("training time", "train_wall_seconds", true,
        number([](const Report& r, size_t i) { return measured(record_of(r, i).train_wall_seconds); },
               duration_text));
    add("throughput img/s", "images_per_second", true,
        number([](const Report& r, size_t i) { return measured(record_of(r, i).images_per_second); },
               throughput_text));
    add("steady img/s", "steady_images_per_second", true,
        number([](const Report& r, size_t i) { return measured(record_of(r, i).steady_images_per_second); },
               throughput_text));
    add("test accuracy", "final_test_accuracy", true,
        number([](const Report& r, size_t i) { return measured(record_of(r, i).final_test_accuracy); },
               fraction_as_percent_text));
    add("speed-up vs baseline", "speedup_vs_baseline", true,
        number(speedup_vs_baseline, [](std::optional<double> v) {
          return v ? printf_string("%.2fx", *v) : std::string(kNotAvailable);
        }));
    add("memory saved vs baseline", "memory_saved_vs_baseline_fraction", true,
        number(memory_saved_vs_baseline,
               [](std::optional<double> v) { return percent_text(v ? std::optional(*v * 100.0) : v, "%.1f%%"); }));
    return c;
  }();
  return all;
}

std::string run_descriptor(const RunRecord& r) {
  return framework_display_name(r.framework) + ", " + r.strategy + ", " + r.precision + ", " +
         std::to_string(r.devices) + (r.devices == 1 ? " device" : " devices") + ", batch " +
         std::to_string(r.batch_size_per_device) + "/device";
}

// Sentences under the table, shared by report.md and report.html (which escape them their own way).
std::vector<std::string> table_notes(const Report& report) {
  std::vector<std::string> notes;
  const ReportRun& base = report.runs[report.baseline];
  if (report.baseline_is_single_device_fp32) {
    notes.push_back("Baseline: " + base.name + " (the ptrain single-device fp32 run).");
  } else {
    notes.push_back("No ptrain single-device fp32 run among these records: " + base.name + " (" +
                    run_descriptor(base.record) + "), the first " +
                    (base.record.framework == metrics::kFrameworkPtrain ? "ptrain run" : "run") + ", is the baseline.");
  }
  notes.push_back(
      "Throughput: training images per second over all devices, evaluation excluded; steady: the same from the "
      "end of the record's steady_from_step on (10 steps, or a quarter of a shorter run), once kernels are tuned "
      "and memory pools grown. Speed-up: steady throughput over the baseline's where both have one, else "
      "throughput over the whole training. Memory saved: 1 - peak "
      "allocator-allocated bytes per GPU over the baseline's; negative means more memory than the baseline.");
  notes.push_back(
      "n/a: not measured (GPU memory and utilisation on a CPU or without NVML, accuracy without evaluation).");
  std::set<std::string> jobs;
  for (const auto& run : report.runs) {
    const RunRecord& r = run.record;
    jobs.insert(r.model + " on " + r.dataset + " at " +
                (r.seq_len ? std::to_string(*r.seq_len) + " tokens" : std::to_string(r.image_size) + " px"));
  }
  if (jobs.size() > 1) {
    std::string list;
    for (const auto& job : jobs) list += (list.empty() ? "" : "; ") + job;
    notes.push_back("The runs train different jobs (" + list + "): their comparisons with the baseline mix them" +
                    (side_by_side(report).empty() ? "." : "; the side-by-side table below compares job by job."));
  }
  return notes;
}

std::string job_summary(const Report& report) {
  std::set<std::string> jobs;
  for (const auto& run : report.runs) {
    const RunRecord& r = run.record;
    jobs.insert(r.model + " on " + r.dataset + " (" +
                (r.seq_len ? std::to_string(*r.seq_len) + " tokens" : std::to_string(r.image_size) + " px") + ")");
  }
  std::string list;
  for (const auto& job : jobs) list += (list.empty() ? "" : ", ") + job;
  return std::to_string(report.runs.size()) + (report.runs.size() == 1 ? " run" : " runs") + ": " + list + ".";
}

// CommonMark: backslash makes any ASCII punctuation literal, so a run called "<script>" or "a|b" neither
// becomes HTML nor splits a cell.
std::string escape_markdown(std::string_view text) {
  std::string out;
  for (const char c : text) {
    if (c == '\n' || c == '\r') {
      out += ' ';
      continue;
    }
    if (std::string_view("\\|<>`*[]").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string out = "\"";
  for (const char c : text) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

// ---------------------------------------------------------------------------------------------------
// Charts: inline SVG, so that report.html needs nothing but itself. Every data mark has class "mark"
// and each chart's data-marks counts them; the page's script counts those the browser actually laid
// out (data-rendered-marks), which tests compare.

constexpr char kPtrainColour[] = "#2563eb";
constexpr char kPytorchColour[] = "#ee4c2c";
// Curves are coloured by run; the two framework colours stay out of it so that a red line never reads as
// PyTorch's (PyTorch curves are dashed instead).
constexpr const char* kRunPalette[] = {"#0f766e", "#7c3aed", "#d97706", "#db2777", "#0891b2",
                                       "#65a30d", "#1e3a8a", "#92400e", "#4b5563", "#be123c"};
constexpr int kChartWidth = 760;

std::string framework_colour(const std::string& framework) {
  return framework == metrics::kFrameworkPytorch ? kPytorchColour : kPtrainColour;
}

std::string run_colour(size_t run) { return kRunPalette[run % std::size(kRunPalette)]; }

std::string px(double value) { return printf_string("%.1f", value); }

// Chart labels have a fixed width; the full name stays in the mark's tooltip.
std::string shortened(const std::string& text, size_t max_code_points) {
  size_t code_points = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if ((static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) continue;  // UTF-8 continuation byte
    if (code_points++ == max_code_points - 1) return text.substr(0, i) + "\xE2\x80\xA6";  // ellipsis
  }
  return text;
}

struct Axis {
  double low = 0.0, high = 1.0, step = 0.2;
};

// 1, 2 or 5 times a power of ten, about five ticks: round numbers a reader can interpolate between.
Axis nice_axis(double low, double high) {
  if (!(high > low)) high = low + (low == 0.0 ? 1.0 : std::abs(low) * 0.1);
  const double raw = (high - low) / 5.0;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double normalised = raw / magnitude;
  const double step = (normalised <= 1.0 ? 1.0 : normalised <= 2.0 ? 2.0 : normalised <= 5.0 ? 5.0 : 10.0) * magnitude;
  return {std::floor(low / step + 1e-9) * step, std::ceil(high / step - 1e-9) * step, step};
}

std::vector<double> ticks_of(const Axis& axis) {
  std::vector<double> ticks;
  for (int i = 0;; ++i) {
    const double t = axis.low + i * axis.step;
    if (t > axis.high + axis.step * 1e-6) break;
    ticks.push_back(std::abs(t) < axis.step * 1e-9 ? 0.0 : t);
  }
  return ticks;
}

using Format = std::function<std::string(double)>;

std::string svg_open(const std::string& chart, const std::string& description, int height, size_t marks) {
  return "<svg xmlns=\"http://www.w3.org/2000/svg\" data-chart=\"" + escape_html(chart) + "\" data-marks=\"" +
         std::to_string(marks) + "\" role=\"img\" aria-label=\"" + escape_html(description) + "\" width=\"" +
         std::to_string(kChartWidth) + "\" height=\"" + std::to_string(height) + "\" viewBox=\"0 0 " +
         std::to_string(kChartWidth) + " " + std::to_string(height) + "\">\n";
}

struct LegendEntry {
  std::string label, colour;
  double opacity = 1.0;
  bool line = false, dashed = false;
};

// Legend items in rows across the chart's width, starting at y; returns the height used.
int draw_legend(std::ostringstream& svg, const std::vector<LegendEntry>& entries, int y) {
  double x = 10.0;
  int row = 0;
  for (const auto& e : entries) {
    const std::string label = shortened(e.label, 40);
    const double width = 28.0 + 7.0 * static_cast<double>(label.size());
    if (x + width > kChartWidth - 10 && x > 10.0) {
      x = 10.0;
      ++row;
    }
    const double cy = y + row * 20 + 8;
    if (e.line) {
      svg << "<line x1=\"" << px(x) << "\" y1=\"" << px(cy) << "\" x2=\"" << px(x + 18) << "\" y2=\"" << px(cy)
          << "\" stroke=\"" << e.colour << "\" stroke-width=\"2\"" << (e.dashed ? " stroke-dasharray=\"5 3\"" : "")
          << "/>";
    } else {
      svg << "<rect x=\"" << px(x + 4) << "\" y=\"" << px(cy - 5) << "\" width=\"10\" height=\"10\" fill=\""
          << e.colour << "\" fill-opacity=\"" << e.opacity << "\"/>";
    }
    svg << "<text x=\"" << px(x + 22) << "\" y=\"" << px(cy + 4) << "\" class=\"legend\">" << escape_html(label)
        << "</text>\n";
    x += width;
  }
  return entries.empty() ? 0 : (row + 1) * 20 + 6;
}

struct BarSeries {
  std::string label;  // empty: one series, no legend entry of its own
  std::function<std::optional<double>(const RunRecord&)> value;
  double opacity = 1.0;
};

std::vector<LegendEntry> framework_legend(const Report& report) {
  std::set<std::string> present;
  for (const auto& run : report.runs) present.insert(run.record.framework);
  std::vector<LegendEntry> legend;
  for (const char* framework : {metrics::kFrameworkPtrain, metrics::kFrameworkPytorch}) {
    if (present.count(framework)) legend.push_back({framework_display_name(framework), framework_colour(framework)});
  }
  return legend;
}

// Horizontal bars, one group per run: long run names fit on the left, and values read off one axis.
std::string bar_chart(const Report& report, const std::string& name, const std::string& description,
                      const std::vector<BarSeries>& series, const Format& value_text, const Format& tick_text) {
  constexpr double kLabelWidth = 230.0, kValueWidth = 90.0, kBarHeight = 16.0, kBarGap = 3.0, kGroupGap = 10.0;
  const double plot_left = kLabelWidth, plot_right = kChartWidth - kValueWidth;

  std::vector<LegendEntry> legend = framework_legend(report);
  if (series.size() > 1) {
    for (const auto& s : series) legend.push_back({s.label, "#6b7280", s.opacity});
  }
  double max_value = 0.0;
  size_t marks = 0;
  for (const auto& run : report.runs) {
    for (const auto& s : series) {
      if (const auto v = s.value(run.record)) {
        max_value = std::max(max_value, *v);
        ++marks;
      }
    }
  }
  const Axis axis = nice_axis(0.0, max_value);
  const auto x_of = [&](double v) { return plot_left + (v - axis.low) / (axis.high - axis.low) * (plot_right - plot_left); };

  std::ostringstream body;
  const int legend_height = draw_legend(body, legend, 6);
  const double group_height = series.size() * (kBarHeight + kBarGap) - kBarGap;
  const double plot_top = legend_height + 10.0;
  const double plot_bottom = plot_top + report.runs.size() * (group_height + kGroupGap);
  const int height = static_cast<int>(plot_bottom + 30.0);

  for (const double t : ticks_of(axis)) {
    body << "<line class=\"grid\" x1=\"" << px(x_of(t)) << "\" y1=\"" << px(plot_top - 4) << "\" x2=\"" << px(x_of(t))
         << "\" y2=\"" << px(plot_bottom) << "\"/><text class=\"tick\" x=\"" << px(x_of(t)) << "\" y=\""
         << px(plot_bottom + 16) << "\" text-anchor=\"middle\">" << escape_html(tick_text(t)) << "</text>\n";
  }
  for (size_t i = 0; i < report.runs.size(); ++i) {
    const ReportRun& run = report.runs[i];
    const double group_top = plot_top + kGroupGap / 2 + i * (group_height + kGroupGap);
    body << "<text class=\"label\" x=\"" << px(plot_left - 8) << "\" y=\"" << px(group_top + group_height / 2 + 4)
         << "\" text-anchor=\"end\"><title>" << escape_html(run.name + " (" + run_descriptor(run.record) + ")")
         << "</title>" << escape_html(shortened(run.name, 32)) << "</text>\n";
    for (size_t s = 0; s < series.size(); ++s) {
      const double y = group_top + s * (kBarHeight + kBarGap);
      const auto value = series[s].value(run.record);
      const std::string series_label = series[s].label.empty() ? "" : series[s].label + ": ";
      if (!value) {
        body << "<text class=\"missing\" x=\"" << px(plot_left + 4) << "\" y=\"" << px(y + kBarHeight - 4) << "\">"
             << escape_html(series_label) << kNotAvailable << "</text>\n";
        continue;
      }
      // At least a pixel wide, so a measured zero still shows (and counts) as a mark; its label says 0.
      const double width = std::max(1.0, x_of(*value) - plot_left);
      body << "<rect class=\"mark\" x=\"" << px(plot_left) << "\" y=\"" << px(y) << "\" width=\"" << px(width)
           << "\" height=\"" << px(kBarHeight) << "\" fill=\"" << framework_colour(run.record.framework)
           << "\" fill-opacity=\"" << series[s].opacity << "\"><title>"
           << escape_html(run.name + ": " + series_label + value_text(*value)) << "</title></rect>"
           << "<text class=\"value\" x=\"" << px(plot_left + width + 4) << "\" y=\"" << px(y + kBarHeight - 4)
           << "\">" << escape_html(value_text(*value)) << "</text>\n";
    }
  }
  body << "<line class=\"axis\" x1=\"" << px(plot_left) << "\" y1=\"" << px(plot_top - 4) << "\" x2=\""
       << px(plot_left) << "\" y2=\"" << px(plot_bottom) << "\"/>\n";
  return svg_open(name, description, height, marks) + body.str() + "</svg>";
}

struct CurvePoint {
  double seconds, value;
  int64_t epoch;
};

// Cumulative training time after each epoch against a per-epoch value. An epoch without a time ends the
// curve: later points would sit at a made-up time.
std::vector<CurvePoint> curve_of(const RunRecord& r, const std::function<std::optional<double>(const metrics::EpochRecord&)>& value) {
  std::vector<CurvePoint> points;
  double seconds = 0.0;
  for (const auto& epoch : r.epochs_detail) {
    if (!std::isfinite(epoch.wall_seconds)) break;
    seconds += epoch.wall_seconds;
    if (const auto v = value(epoch)) points.push_back({seconds, *v, epoch.epoch});
  }
  return points;
}

std::string line_chart(const Report& report, const std::string& name, const std::string& description,
                       const std::string& y_title, bool y_from_zero,
                       const std::function<std::optional<double>(const metrics::EpochRecord&)>& value,
                       const Format& value_text, const Format& tick_text) {
  constexpr double kLeft = 70.0, kRight = 20.0, kPlotHeight = 240.0;
  std::vector<std::vector<CurvePoint>> curves;
  double max_seconds = 0.0, low = INFINITY, high = -INFINITY;
  size_t marks = 0;
  for (const auto& run : report.runs) {
    curves.push_back(curve_of(run.record, value));
    for (const auto& p : curves.back()) {
      max_seconds = std::max(max_seconds, p.seconds);
      low = std::min(low, p.value);
      high = std::max(high, p.value);
      ++marks;
    }
  }
  if (marks == 0) low = high = 0.0;
  const Axis x_axis = nice_axis(0.0, max_seconds);
  const Axis y_axis = nice_axis(y_from_zero ? std::min(0.0, low) : low, high);

  std::vector<LegendEntry> legend;
  for (size_t i = 0; i < report.runs.size(); ++i) {
    if (curves[i].empty()) continue;
    const bool pytorch = report.runs[i].record.framework == metrics::kFrameworkPytorch;
    legend.push_back({report.runs[i].name + (pytorch ? " (PyTorch)" : ""), run_colour(i), 1.0, true, pytorch});
  }
  std::ostringstream body;
  const double plot_top = 14.0, plot_bottom = plot_top + kPlotHeight;
  const double plot_left = kLeft, plot_right = kChartWidth - kRight;
  const auto x_of = [&](double s) { return plot_left + (s - x_axis.low) / (x_axis.high - x_axis.low) * (plot_right - plot_left); };
  const auto y_of = [&](double v) { return plot_bottom - (v - y_axis.low) / (y_axis.high - y_axis.low) * kPlotHeight; };

  for (const double t : ticks_of(y_axis)) {
    body << "<line class=\"grid\" x1=\"" << px(plot_left) << "\" y1=\"" << px(y_of(t)) << "\" x2=\"" << px(plot_right)
         << "\" y2=\"" << px(y_of(t)) << "\"/><text class=\"tick\" x=\"" << px(plot_left - 6) << "\" y=\""
         << px(y_of(t) + 4) << "\" text-anchor=\"end\">" << escape_html(tick_text(t)) << "</text>\n";
  }
  for (const double t : ticks_of(x_axis)) {
    body << "<line class=\"grid\" x1=\"" << px(x_of(t)) << "\" y1=\"" << px(plot_top) << "\" x2=\"" << px(x_of(t))
         << "\" y2=\"" << px(plot_bottom) << "\"/><text class=\"tick\" x=\"" << px(x_of(t)) << "\" y=\""
         << px(plot_bottom + 16) << "\" text-anchor=\"middle\">" << escape_html(shortest_number(t)) << "</text>\n";
  }
  body << "<text class=\"axis-title\" x=\"" << px((plot_left + plot_right) / 2) << "\" y=\"" << px(plot_bottom + 34)
       << "\" text-anchor=\"middle\">training time (s, cumulative over epochs)</text>\n"
       << "<text class=\"axis-title\" transform=\"translate(14 " << px((plot_top + plot_bottom) / 2)
       << ") rotate(-90)\" text-anchor=\"middle\">" << escape_html(y_title) << "</text>\n"
       << "<rect class=\"frame\" x=\"" << px(plot_left) << "\" y=\"" << px(plot_top) << "\" width=\""
       << px(plot_right - plot_left) << "\" height=\"" << px(kPlotHeight) << "\"/>\n";
  for (size_t i = 0; i < curves.size(); ++i) {
    if (curves[i].empty()) continue;
    const ReportRun& run = report.runs[i];
    const bool pytorch = run.record.framework == metrics::kFrameworkPytorch;
    body << "<polyline class=\"line\" fill=\"none\" stroke=\"" << run_colour(i) << "\" stroke-width=\"2\""
         << (pytorch ? " stroke-dasharray=\"6 4\"" : "") << " points=\"";
    for (const auto& p : curves[i]) body << px(x_of(p.seconds)) << "," << px(y_of(p.value)) << " ";
    body << "\"/>\n";
    for (const auto& p : curves[i]) {
      body << "<circle class=\"mark\" cx=\"" << px(x_of(p.seconds)) << "\" cy=\"" << px(y_of(p.value))
           << "\" r=\"3.5\" fill=\"" << run_colour(i) << "\"><title>"
           << escape_html(run.name + ", epoch " + std::to_string(p.epoch) + ", " + shortest_number(p.seconds) +
                          " s: " + value_text(p.value))
           << "</title></circle>\n";
    }
  }
  const int legend_height = draw_legend(body, legend, static_cast<int>(plot_bottom + 44));
  const int height = static_cast<int>(plot_bottom + 44 + legend_height + 4);
  return svg_open(name, description, height, marks) + body.str() + "</svg>";
}

std::string runs_without_curves(const Report& report) {
  std::string names;
  for (const auto& run : report.runs) {
    if (run.record.epochs_detail.empty()) names += (names.empty() ? "" : ", ") + run.name;
  }
  return names;
}

const char* const kStyle = R"(
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #111827; margin: 24px; max-width: 1200px; }
h1 { font-size: 22px; margin: 0 0 6px; }
h2 { font-size: 17px; margin: 28px 0 8px; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #d1d5db; padding: 4px 8px; white-space: nowrap; }
th { background: #f3f4f6; text-align: left; white-space: normal; vertical-align: bottom; }
td.number { text-align: right; font-variant-numeric: tabular-nums; }
tr.baseline td { background: #eff6ff; }
.table-wrap { overflow-x: auto; }
p.note { color: #4b5563; margin: 4px 0; font-size: 13px; }
figure { margin: 18px 0 26px; }
figcaption { font-weight: 600; margin-bottom: 4px; }
svg { max-width: 100%; height: auto; font-size: 12px; }
svg text { fill: #111827; }
svg .tick, svg .missing { fill: #6b7280; }
svg .grid { stroke: #e5e7eb; }
svg .axis { stroke: #6b7280; }
svg .frame { fill: none; stroke: #9ca3af; }
)";

// Lets a headless browser prove that the charts were laid out, not only written: the tests compare the
// count of marks with a non-empty box against data-marks.
const char* const kMarkCheckScript = R"(
window.addEventListener('load', function () {
  document.querySelectorAll('svg[data-chart]').forEach(function (chart) {
    var rendered = 0;
    chart.querySelectorAll('.mark').forEach(function (mark) {
      var box = mark.getBBox();
      if (box.width > 0 && box.height > 0) rendered += 1;
    });
    chart.setAttribute('data-rendered-marks', String(rendered));
  });
  document.body.dataset.chartsChecked = '1';
});
)";

std::string figure(const std::string& caption, const std::string& svg, const std::string& note = "") {
  return "<figure><figcaption>" + escape_html(caption) + "</figcaption>\n" + svg + "\n" +
         (note.empty() ? "" : "<p class=\"note\">" + escape_html(note) + "</p>\n") + "</figure>\n";
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  check(in.good(), "cannot read run record " + path.string());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_file_atomically(const fs::path& path, const std::string& text) {
  const fs::path temp = path.string() + ".tmp";
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    check(out.good(), "cannot write " + temp.string());
    out << text;
    out.flush();
    check(out.good(), "cannot write " + temp.string());
  }
  // POSIX rename rather than std::filesystem's: LibTorch 2.x wheels export their own copies of those
  // (pytorch/pytorch#133437), which the dynamic linker may bind instead of libstdc++'s.
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    ::unlink(temp.c_str());
    throw Error("cannot write " + path.string() + ": " + reason);
  }
}

// The directory's own name, for telling apart runs of the same name in different --runs directories.
std::string directory_name(const std::string& dir) {
  fs::path path = fs::absolute(dir).lexically_normal();
  if (path.filename().empty()) path = path.parent_path();
  return path.filename().string();
}

}  // namespace

std::string escape_html(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::vector<ReportRun> read_runs(const std::vector<std::string>& run_dirs) {
  check(!run_dirs.empty(), "no run directory given");
  std::vector<ReportRun> runs;
  std::vector<std::string> directory_of_run;
  for (const auto& dir : run_dirs) {
    std::error_code error;
    check(fs::is_directory(dir, error), "run directory " + dir + " does not exist or is not a directory");
    std::vector<fs::path> files;
    for (auto it = fs::recursive_directory_iterator(dir, error); !error && it != fs::recursive_directory_iterator();
         it.increment(error)) {
      if (it->is_regular_file() && it->path().extension() == ".json") files.push_back(it->path());
    }
    check(!error, "cannot list run directory " + dir + ": " + error.message());
    check(!files.empty(), "run directory " + dir + " holds no run record (*.json)");
    std::sort(files.begin(), files.end());
    for (const auto& file : files) {
      nlohmann::json json;
      try {
        json = nlohmann::json::parse(read_file(file));
      } catch (const nlohmann::json::exception& e) {
        throw Error(file.string() + ": not valid JSON: " + e.what());
      }
      ReportRun run;
      try {
        run.record = metrics::run_record_from_json(json);
      } catch (const Error& e) {
        throw Error(file.string() + ": " + e.what());
      }
      run.name = file.lexically_relative(dir).replace_extension().string();
      run.source = file.string();
      runs.push_back(std::move(run));
      directory_of_run.push_back(directory_name(dir));
    }
  }
  std::map<std::string, int> uses;
  for (const auto& run : runs) ++uses[run.name];
  for (size_t i = 0; i < runs.size(); ++i) {
    if (uses[runs[i].name] > 1) runs[i].name = directory_of_run[i] + "/" + runs[i].name;
  }
  return runs;
}

namespace {

// Where a name stands in a list of known names; unknown ones after all of them, among themselves by name.
size_t rank_in(const std::vector<std::string>& order, const std::string& name) {
  const auto it = std::find(order.begin(), order.end(), name);
  return static_cast<size_t>(it - order.begin());
}

// Rows read as the comparison goes: devices, then the strategy, then the precision from full to least,
// each ptrain run before the PyTorch run of the same mode.
bool comes_before(const ReportRun& a, const ReportRun& b) {
  static const std::vector<std::string> strategies{"single", "dp", "ddp", "zero1", "zero2", "zero3", "fsdp"};
  static const std::vector<std::string> precisions{"fp32", "tf32", "fp16", "fp16+master", "bf16", "bf16+master",
                                                   "amp-fp16", "amp-bf16"};
  const auto key = [](const ReportRun& run) {
    const auto& r = run.record;
    return std::make_tuple(r.model, r.dataset, r.devices, rank_in(strategies, r.strategy), r.strategy,
                           rank_in(precisions, r.precision), r.precision, r.framework != "ptrain",
                           r.compiled.value_or(false), run.name);
  };
  return key(a) < key(b);
}

// ---------------------------------------------------------------------------------------------------
// Side by side: ptrain, PyTorch eager and PyTorch compiled per job and mode.

constexpr char kChannelsLastSuffix[] = "+channels-last";

bool ends_with(const std::string& text, const std::string& end) {
  return text.size() >= end.size() && text.compare(text.size() - end.size(), end.size(), end) == 0;
}

std::string base_precision(const std::string& precision) {
  return ends_with(precision, kChannelsLastSuffix)
             ? precision.substr(0, precision.size() - std::string(kChannelsLastSuffix).size())
             : precision;
}

bool is_language_model_run(const RunRecord& r) {
  return r.seq_len.has_value() || r.dataset == "synthetic-tokens" || r.dataset == "text";
}

// Records before the channels_last field said it in the PyTorch reference's precision.
std::optional<bool> memory_format_of(const RunRecord& r) {
  if (is_language_model_run(r)) return std::nullopt;
  return r.channels_last ? *r.channels_last : ends_with(r.precision, kChannelsLastSuffix);
}

}  // namespace

Report make_report(std::vector<ReportRun> runs, std::string title) {
  check(!runs.empty(), "a report needs at least one run");
  Report report;
  report.title = std::move(title);
  report.runs = std::move(runs);
  std::stable_sort(report.runs.begin(), report.runs.end(), comes_before);
  const auto it = std::find_if(report.runs.begin(), report.runs.end(),
                               [](const ReportRun& run) { return is_single_device_fp32_ptrain(run.record); });
  report.baseline_is_single_device_fp32 = it != report.runs.end();
  if (report.baseline_is_single_device_fp32) {
    report.baseline = static_cast<size_t>(it - report.runs.begin());
  } else {
    const auto first_ptrain = std::find_if(report.runs.begin(), report.runs.end(), [](const ReportRun& run) {
      return run.record.framework == metrics::kFrameworkPtrain;
    });
    report.baseline = first_ptrain != report.runs.end() ? static_cast<size_t>(first_ptrain - report.runs.begin()) : 0;
  }
  return report;
}

std::optional<double> speedup_vs_baseline(const Report& report, size_t run) {
  const RunRecord& r = record_of(report, run);
  const RunRecord& b = record_of(report, report.baseline);
  const bool steady = measured(r.steady_images_per_second) && measured(b.steady_images_per_second);
  const auto mine = measured(steady ? *r.steady_images_per_second : r.images_per_second);
  const auto base = measured(steady ? *b.steady_images_per_second : b.images_per_second);
  if (!mine || !base || *base <= 0.0) return std::nullopt;
  return *mine / *base;
}

std::optional<double> memory_saved_vs_baseline(const Report& report, size_t run) {
  const auto mine = measured(record_of(report, run).peak_allocated_bytes);
  const auto base = measured(record_of(report, report.baseline).peak_allocated_bytes);
  if (!mine || !base || *base <= 0.0) return std::nullopt;
  return 1.0 - *mine / *base;
}

std::optional<double> throughput_ratio(const Report& report, size_t a, size_t b) {
  const RunRecord& r = record_of(report, a);
  const RunRecord& q = record_of(report, b);
  const bool steady = measured(r.steady_images_per_second) && measured(q.steady_images_per_second);
  const auto mine = measured(steady ? *r.steady_images_per_second : r.images_per_second);
  const auto theirs = measured(steady ? *q.steady_images_per_second : q.images_per_second);
  if (!mine || !theirs || *theirs <= 0.0) return std::nullopt;
  return *mine / *theirs;
}

std::vector<SideBySideRow> side_by_side(const Report& report) {
  static const std::vector<std::string> strategies{"single", "dp", "ddp", "zero1", "zero2", "zero3", "fsdp"};
  static const std::vector<std::string> precisions{"fp32", "tf32", "fp16", "fp16+master", "bf16", "bf16+master",
                                                   "amp-fp16", "amp-bf16"};
  using Key = std::tuple<std::string, std::string, int64_t, int64_t, int64_t, int64_t, size_t, std::string, size_t,
                         std::string>;
  struct Group {
    SideBySideRow shape;
    std::vector<size_t> ptrain, eager, compiled;
  };
  std::map<Key, Group> groups;
  for (size_t i = 0; i < report.runs.size(); ++i) {
    const RunRecord& r = report.runs[i].record;
    const std::string precision = base_precision(r.precision);
    const Key key{r.model, r.dataset, r.image_size, r.seq_len.value_or(0), r.batch_size_per_device, r.devices,
                  rank_in(strategies, r.strategy), r.strategy, rank_in(precisions, precision), precision};
    Group& group = groups[key];
    group.shape = {r.model, r.dataset, precision, r.strategy, r.devices, r.batch_size_per_device, r.image_size,
                   r.seq_len, std::nullopt, std::nullopt, std::nullopt, std::nullopt};
    if (r.framework == metrics::kFrameworkPtrain) {
      group.ptrain.push_back(i);
    } else if (r.compiled.value_or(false)) {
      group.compiled.push_back(i);
    } else {
      group.eager.push_back(i);
    }
  }
  std::vector<SideBySideRow> rows;
  for (const auto& [key, group] : groups) {
    if (group.eager.empty() && group.compiled.empty()) continue;  // nothing of PyTorch's to compare with
    // One row per memory format of ptrain's and eager's runs (they compare like with like); compiled is PyTorch
    // at its best in whatever format, beside each.
    std::vector<std::optional<bool>> formats;
    for (const auto* runs : {&group.ptrain, &group.eager}) {
      for (size_t i : *runs) {
        const auto format = memory_format_of(report.runs[i].record);
        if (std::find(formats.begin(), formats.end(), format) == formats.end()) formats.push_back(format);
      }
    }
    if (formats.empty()) formats.push_back(memory_format_of(report.runs[group.compiled.front()].record));
    std::sort(formats.begin(), formats.end());
    for (const auto& format : formats) {
      SideBySideRow row = group.shape;
      row.channels_last = format;
      const auto first_in = [&](const std::vector<size_t>& runs) -> std::optional<size_t> {
        for (size_t i : runs) {
          if (memory_format_of(report.runs[i].record) == format) return i;
        }
        return std::nullopt;
      };
      row.ptrain = first_in(group.ptrain);
      row.eager = first_in(group.eager);
      if (!group.compiled.empty()) row.compiled = first_in(group.compiled).value_or(group.compiled.front());
      rows.push_back(row);
    }
  }
  return rows;
}

namespace {

// Steady throughput where measured, else over the whole training; in tokens for language models.
std::optional<double> shown_throughput(const RunRecord& r) {
  if (is_language_model_run(r)) {
    if (const auto steady = measured(r.steady_tokens_per_second)) return steady;
    return measured(r.tokens_per_second);
  }
  if (const auto steady = measured(r.steady_images_per_second)) return steady;
  return measured(r.images_per_second);
}

const char* throughput_unit(const SideBySideRow& row) { return row.seq_len ? "tokens/s" : "img/s"; }

std::string side_by_side_data(const SideBySideRow& row) {
  return row.dataset + (row.seq_len ? ", " + std::to_string(*row.seq_len) + " tokens"
                                    : row.image_size > 0 ? ", " + std::to_string(row.image_size) + " px" : "") +
         ", batch " + std::to_string(row.batch_size_per_device);
}

std::string side_by_side_format(const SideBySideRow& row) {
  return !row.channels_last ? "-" : *row.channels_last ? "channels-last" : "NCHW";
}

std::string ratio_text(std::optional<double> ratio) {
  return ratio ? printf_string("%.2fx", *ratio) : std::string(kNotAvailable);
}

const std::vector<const char*>& side_by_side_titles() {
  static const std::vector<const char*> titles{
      "model", "data", "precision", "devices", "memory format", "ptrain", "PyTorch eager", "PyTorch compiled",
      "ptrain / eager", "ptrain / compiled", "ptrain peak/GPU", "eager peak/GPU", "compiled peak/GPU"};
  return titles;
}

std::vector<std::string> side_by_side_cells(const Report& report, const SideBySideRow& row) {
  const auto throughput = [&](std::optional<size_t> run) {
    if (!run) return std::string(kNotAvailable);
    const auto value = shown_throughput(record_of(report, *run));
    return value ? throughput_text(value) + " " + throughput_unit(row) : std::string(kNotAvailable);
  };
  const auto ratio = [&](std::optional<size_t> other) {
    return ratio_text(row.ptrain && other ? throughput_ratio(report, *row.ptrain, *other) : std::nullopt);
  };
  const auto peak = [&](std::optional<size_t> run) {
    return run ? gib_text(measured(record_of(report, *run).peak_allocated_bytes)) : std::string(kNotAvailable);
  };
  return {row.model,
          side_by_side_data(row),
          row.precision,
          std::to_string(row.devices) + ", " + row.strategy,
          side_by_side_format(row),
          throughput(row.ptrain),
          throughput(row.eager),
          throughput(row.compiled),
          ratio(row.eager),
          ratio(row.compiled),
          peak(row.ptrain),
          peak(row.eager),
          peak(row.compiled)};
}

const char* const kSideBySideHeading = "ptrain beside PyTorch";

const char* const kSideBySideNote =
    "Steady throughput (from the end of each record's steady_from_step on; over the whole training where a run "
    "has no steady figure), in tokens per second for language models. Ratios: ptrain's over PyTorch's, above 1 "
    "when ptrain is faster. PyTorch eager is the classic comparison in ptrain's memory format; PyTorch compiled "
    "is torch.compile (default mode) with channels-last for convolutional models and the fused optimizer step, "
    "beside each memory format of ptrain's. Peak: allocator-allocated bytes per GPU.";

}  // namespace

std::string render_side_by_side_csv(const Report& report) {
  const auto rows = side_by_side(report);
  if (rows.empty()) return "";
  std::ostringstream csv;
  csv << "model,dataset,image_size,seq_len,batch_size_per_device,precision,strategy,devices,channels_last,"
         "throughput_unit,ptrain_per_second,pytorch_eager_per_second,pytorch_compiled_per_second,"
         "ptrain_vs_pytorch_eager,ptrain_vs_pytorch_compiled,ptrain_peak_allocated_bytes,"
         "pytorch_eager_peak_allocated_bytes,pytorch_compiled_peak_allocated_bytes,ptrain_run,pytorch_eager_run,"
         "pytorch_compiled_run\n";
  for (const auto& row : rows) {
    const auto throughput = [&](std::optional<size_t> run) {
      return run ? csv_number(shown_throughput(record_of(report, *run))) : std::string();
    };
    const auto ratio = [&](std::optional<size_t> other) {
      return csv_number(row.ptrain && other ? throughput_ratio(report, *row.ptrain, *other) : std::nullopt);
    };
    const auto peak = [&](std::optional<size_t> run) {
      return run ? csv_number(measured(record_of(report, *run).peak_allocated_bytes)) : std::string();
    };
    const auto name = [&](std::optional<size_t> run) { return run ? report.runs[*run].name : std::string(); };
    const std::vector<std::string> fields{
        row.model, row.dataset, std::to_string(row.image_size), row.seq_len ? std::to_string(*row.seq_len) : "",
        std::to_string(row.batch_size_per_device), row.precision, row.strategy, std::to_string(row.devices),
        row.channels_last ? (*row.channels_last ? "true" : "false") : "",
        row.seq_len ? "tokens" : "images", throughput(row.ptrain), throughput(row.eager), throughput(row.compiled),
        ratio(row.eager), ratio(row.compiled), peak(row.ptrain), peak(row.eager), peak(row.compiled),
        name(row.ptrain), name(row.eager), name(row.compiled)};
    for (size_t c = 0; c < fields.size(); ++c) csv << (c ? "," : "") << csv_field(fields[c]);
    csv << "\n";
  }
  return csv.str();
}

std::string render_markdown(const Report& report) {
  std::ostringstream md;
  md << "# " << escape_markdown(report.title) << "\n\n" << escape_markdown(job_summary(report)) << "\n\n|";
  for (const auto& column : columns()) md << " " << column.title << " |";
  md << "\n|";
  for (const auto& column : columns()) md << (column.numeric ? " ---: |" : " --- |");
  md << "\n";
  for (size_t i = 0; i < report.runs.size(); ++i) {
    md << "|";
    for (const auto& column : columns()) md << " " << escape_markdown(column.text(report, i)) << " |";
    md << "\n";
  }
  md << "\n";
  for (const auto& note : table_notes(report)) md << escape_markdown(note) << "\n\n";
  const auto rows = side_by_side(report);
  if (!rows.empty()) {
    md << "## " << kSideBySideHeading << "\n\n|";
    for (const char* title : side_by_side_titles()) md << " " << title << " |";
    md << "\n|";
    for (size_t c = 0; c < side_by_side_titles().size(); ++c) md << (c < 5 ? " --- |" : " ---: |");
    md << "\n";
    for (const auto& row : rows) {
      md << "|";
      for (const auto& cell : side_by_side_cells(report, row)) md << " " << escape_markdown(cell) << " |";
      md << "\n";
    }
    md << "\n" << escape_markdown(kSideBySideNote) << "\n\n";
  }
  return md.str();
}

std::string render_csv(const Report& report) {
  std::ostringstream csv;
  const auto& all = columns();
  for (size_t c = 0; c < all.size(); ++c) csv << (c ? "," : "") << all[c].csv_name;
  csv << "\n";
  for (size_t i = 0; i < report.runs.size(); ++i) {
    for (size_t c = 0; c < all.size(); ++c) csv << (c ? "," : "") << csv_field(all[c].csv(report, i));
    csv << "\n";
  }
  return csv.str();
}

std::string render_html(const Report& report) {
  std::ostringstream html;
  html << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
       << "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>"
       << escape_html(report.title) << "</title>\n<style>" << kStyle << "</style>\n</head>\n<body>\n<h1>"
       << escape_html(report.title) << "</h1>\n<p>" << escape_html(job_summary(report)) << "</p>\n";

  html << "<div class=\"table-wrap\"><table>\n<thead><tr>";
  for (const auto& column : columns()) html << "<th>" << escape_html(column.title) << "</th>";
  html << "</tr></thead>\n<tbody>\n";
  for (size_t i = 0; i < report.runs.size(); ++i) {
    html << "<tr" << (i == report.baseline ? " class=\"baseline\"" : "") << " title=\""
         << escape_html(report.runs[i].source) << "\">";
    for (const auto& column : columns()) {
      html << "<td" << (column.numeric ? " class=\"number\"" : "") << ">" << escape_html(column.text(report, i))
           << "</td>";
    }
    html << "</tr>\n";
  }
  html << "</tbody>\n</table></div>\n";
  for (const auto& note : table_notes(report)) html << "<p class=\"note\">" << escape_html(note) << "</p>\n";
  const auto side_rows = side_by_side(report);
  if (!side_rows.empty()) {
    html << "<h2>" << escape_html(kSideBySideHeading) << "</h2>\n<div class=\"table-wrap\"><table class=\"side-by-side\">\n"
         << "<thead><tr>";
    for (const char* title : side_by_side_titles()) html << "<th>" << escape_html(title) << "</th>";
    html << "</tr></thead>\n<tbody>\n";
    for (const auto& row : side_rows) {
      html << "<tr>";
      const auto cells = side_by_side_cells(report, row);
      for (size_t c = 0; c < cells.size(); ++c) {
        html << "<td" << (c >= 5 ? " class=\"number\"" : "") << ">" << escape_html(cells[c]) << "</td>";
      }
      html << "</tr>\n";
    }
    html << "</tbody>\n</table></div>\n<p class=\"note\">" << escape_html(kSideBySideNote) << "</p>\n";
  }

  // Memory is charted in GiB rather than bytes so that the axis gets round GiB ticks.
  const auto in_gib = [](std::optional<int64_t> bytes) {
    const auto value = measured(bytes);
    return value ? std::optional<double>(*value / kGiB) : std::nullopt;
  };
  const auto gib_value = [](double gib) { return printf_string("%.2f GiB", gib); };
  const auto gib_tick = [](double gib) { return shortest_number(gib) + " GiB"; };
  const auto seconds_value = [](double s) { return duration_text(s); };
  const auto number_tick = [](double v) { return shortest_number(v); };
  const auto percent_value = [](double f) { return printf_string("%.2f%%", f * 100.0); };
  const auto percent_tick = [](double f) { return printf_string("%g%%", std::round(f * 1000.0) / 10.0); };
  const auto plain_value = [](double v) { return throughput_text(v); };
  const auto loss_value = [](double v) { return printf_string("%.4f", v); };

  html << "<h2>Charts</h2>\n";
  html << figure("Throughput (training images per second, all devices, evaluation excluded)",
                 bar_chart(report, "throughput", "training throughput by run",
                           {{"whole training", [](const RunRecord& r) { return measured(r.images_per_second); }, 0.45},
                            {"steady (after warm-up steps)",
                             [](const RunRecord& r) { return measured(r.steady_images_per_second); }, 1.0}},
                           plain_value,
                           number_tick));
  html << figure(
      "Peak GPU memory per GPU",
      bar_chart(report, "peak-memory", "peak GPU memory per GPU by run",
                {{"allocator peak allocated", [&](const RunRecord& r) { return in_gib(r.peak_allocated_bytes); }, 1.0},
                 {"NVML peak used", [&](const RunRecord& r) { return in_gib(r.peak_nvml_used_bytes); }, 0.45}},
                gib_value, gib_tick),
      "Allocated: bytes held by tensors (CUDA caching allocator). NVML used: the driver's view, with the CUDA "
      "context and any other process on the GPU.");
  html << figure("Total time (whole run: setup, training, evaluation)",
                 bar_chart(report, "total-time", "total wall time by run",
                           {{"", [](const RunRecord& r) { return measured(r.total_wall_seconds); }}}, seconds_value,
                           number_tick));
  html << figure("Final test accuracy",
                 bar_chart(report, "accuracy", "final test accuracy by run",
                           {{"", [](const RunRecord& r) { return measured(r.final_test_accuracy); }}},
                           percent_value, percent_tick));

  const std::string missing = runs_without_curves(report);
  const std::string no_curve_note = missing.empty() ? "" : "No curve for runs without epochs_detail: " + missing + ".";
  html << figure("Training loss over training time",
                 line_chart(report, "loss-curve", "training loss against cumulative training time", "train loss", true,
                            [](const metrics::EpochRecord& e) { return measured(e.train_loss); }, loss_value,
                            number_tick),
                 no_curve_note);
  html << figure("Test accuracy over training time",
                 line_chart(report, "accuracy-curve", "test accuracy against cumulative training time",
                            "test accuracy", false,
                            [](const metrics::EpochRecord& e) { return measured(e.test_accuracy); }, percent_value,
                            percent_tick),
                 no_curve_note);
  html << "<script>" << kMarkCheckScript << "</script>\n</body>\n</html>\n";
  return html.str();
}

WrittenReport write_report(const std::vector<std::string>& run_dirs, const std::string& out_dir,
                           const std::string& title) {
  const Report report = make_report(read_runs(run_dirs), title);
  std::error_code error;
  fs::create_directories(out_dir, error);
  check(!error, "cannot create report directory " + out_dir + ": " + error.message());
  WrittenReport written;
  written.markdown = render_markdown(report);
  written.markdown_path = (fs::path(out_dir) / "report.md").string();
  written.csv_path = (fs::path(out_dir) / "report.csv").string();
  written.html_path = (fs::path(out_dir) / "report.html").string();
  write_file_atomically(written.markdown_path, written.markdown);
  write_file_atomically(written.csv_path, render_csv(report));
  write_file_atomically(written.html_path, render_html(report));
  const std::string side_by_side_csv = render_side_by_side_csv(report);
  const fs::path side_by_side_path = fs::path(out_dir) / "side-by-side.csv";
  if (!side_by_side_csv.empty()) {
    written.side_by_side_csv_path = side_by_side_path.string();
    write_file_atomically(side_by_side_path, side_by_side_csv);
  } else {
    ::unlink(side_by_side_path.c_str());  // a report of other runs in the same folder must not keep an old one
  }
  return written;
}

}  // namespace ptrain::bench
