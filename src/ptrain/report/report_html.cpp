// report.html: one self-contained page that opens offline, the table model (report_table.h) as HTML tables
// and the runs as inline SVG charts, with its style sheet and the script that lets a headless browser prove
// the charts were laid out.
#include <algorithm>
#include <cmath>
#include <functional>
#include <set>
#include <sstream>

#include "ptrain/report/report.h"
#include "ptrain/report/report_table.h"

namespace ptrain::report {

using namespace table;
using metrics::RunRecord;

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

namespace {

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

// Cumulative training time after each epoch against a per-epoch value. An epoch without a time ends the
// curve: later points would sit at a made-up time.
std::vector<CurvePoint> curve_of(const RunRecord& r, const std::function<std::optional<double>(const metrics::EpochRecord&)>& value) {
  std::vector<CurvePoint> points;
  double seconds = 0.0;
  for (const auto& epoch : r.epochs_detail) {
    if (!std::isfinite(epoch.wall_seconds)) break;
    seconds += epoch.wall_seconds;
    if (const auto v = value(epoch))
      points.push_back({seconds, *v, "epoch " + std::to_string(epoch.epoch) + ", " + shortest_number(seconds) + " s"});
  }
  return points;
}

// Each run's curve (curve_of, or report_curves.h's per step) against x_title.
std::string line_chart(const Report& report, const std::string& name, const std::string& description,
                       const std::string& x_title, const std::string& y_title, bool y_from_zero,
                       const std::function<std::vector<CurvePoint>(const ReportRun&)>& curve_of_run,
                       const Format& value_text, const Format& tick_text) {
  constexpr double kLeft = 70.0, kRight = 20.0, kPlotHeight = 240.0;
  std::vector<std::vector<CurvePoint>> curves;
  double max_x = 0.0, low = INFINITY, high = -INFINITY;
  size_t marks = 0;
  for (const auto& run : report.runs) {
    curves.push_back(curve_of_run(run));
    for (const auto& p : curves.back()) {
      max_x = std::max(max_x, p.x);
      low = std::min(low, p.value);
      high = std::max(high, p.value);
      ++marks;
    }
  }
  if (marks == 0) low = high = 0.0;
  const Axis x_axis = nice_axis(0.0, max_x);
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
       << "\" text-anchor=\"middle\">" << escape_html(x_title) << "</text>\n"
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
    for (const auto& p : curves[i]) body << px(x_of(p.x)) << "," << px(y_of(p.value)) << " ";
    body << "\"/>\n";
    for (const auto& p : curves[i]) {
      body << "<circle class=\"mark\" cx=\"" << px(x_of(p.x)) << "\" cy=\"" << px(y_of(p.value))
           << "\" r=\"3.5\" fill=\"" << run_colour(i) << "\"><title>"
           << escape_html(run.name + ", " + p.where + ": " + value_text(p.value))
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
/* The first column (the run, the model) stays in view while a wide table scrolls sideways; a long name wraps
   rather than widen it. Collapsed borders scroll away with their cells, so it draws its own right edge. */
.table-wrap th:first-child, .table-wrap td:first-child { position: sticky; left: 0; z-index: 1; background: #fff;
  white-space: normal; min-width: 8em; max-width: 16em; box-shadow: inset -1px 0 0 #9ca3af; }
.table-wrap th:first-child { background: #f3f4f6; z-index: 2; }
.table-wrap tr.baseline td:first-child { background: #eff6ff; }
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

// Loss (and, where runs logged it, throughput) per optimizer step: each logged step of the runs' --log-jsonl
// files, one point an epoch for runs without one.
std::string step_curves(const Report& report, const Format& loss_value, const Format& tick_text,
                        const Format& throughput_value) {
  std::string with_log, without_any;
  for (const auto& run : report.runs) {
    if (!run.logged_steps.empty()) with_log += (with_log.empty() ? "" : ", ") + run.name;
    if (loss_per_step(run).empty()) without_any += (without_any.empty() ? "" : ", ") + run.name;
  }
  std::string note = with_log.empty() ? "One point an epoch: its mean training loss, at its last step."
                                      : "Every logged step (--log-jsonl) of " + with_log +
                                            "; one point an epoch (its mean loss, at its last step) for the others.";
  if (!without_any.empty()) note += " No curve for runs without epochs_detail or a log: " + without_any + ".";
  std::string html = figure("Training loss per optimizer step",
                            line_chart(report, "loss-curve", "training loss against the optimizer step", "optimizer step",
                                       "train loss", true, loss_per_step, loss_value, tick_text),
                            note);
  if (!with_log.empty()) {
    html += figure("Training throughput per logged step (over all devices, since the previous logged step)",
                   line_chart(report, "throughput-curve", "training throughput against the optimizer step",
                              "optimizer step", "images (or tokens) per second", true, throughput_per_step,
                              throughput_value, tick_text));
  }
  return html;
}


}  // namespace

std::string render_html(const Report& report) {
  std::ostringstream html;
  html << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
       << "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>"
       << escape_html(report.title) << "</title>\n<style>" << kStyle << "</style>\n</head>\n<body>\n<h1>"
       << escape_html(report.title) << "</h1>\n<p>" << escape_html(job_summary(report)) << "</p>\n";
  for (const auto& note : report.notes) html << "<p>" << escape_html(note) << "</p>\n";

  html << "<div class=\"table-wrap\"><table>\n<thead><tr>";
  for (const auto& column : table_columns()) html << "<th>" << escape_html(column_title(column, report)) << "</th>";
  html << "</tr></thead>\n<tbody>\n";
  for (size_t i = 0; i < report.runs.size(); ++i) {
    html << "<tr" << (report.is_baseline(i) ? " class=\"baseline\"" : "") << " title=\""
         << escape_html(report.runs[i].source) << "\">";
    for (const auto& column : table_columns()) {
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
    for (const auto& title : side_by_side_titles(report)) html << "<th>" << escape_html(title) << "</th>";
    html << "</tr></thead>\n<tbody>\n";
    for (const auto& row : side_rows) {
      html << "<tr>";
      const auto cells = side_by_side_cells(report, row);
      for (size_t c = 0; c < cells.size(); ++c) {
        html << "<td" << (c >= kSideBySideTextColumns ? " class=\"number\"" : "") << ">" << escape_html(cells[c]) << "</td>";
      }
      html << "</tr>\n";
    }
    html << "</tbody>\n</table></div>\n<p class=\"note\">" << escape_html(side_by_side_note(report)) << "</p>\n";
  }
  for (const auto& note : noise_notes(report)) html << "<p class=\"note\">" << escape_html(note) << "</p>\n";

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
      memory_unit(report) == "GPU" ? "Peak GPU memory per GPU" : "Peak memory per device",
      bar_chart(report, "peak-memory", "peak memory per " + memory_unit(report) + " by run",
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
                           {{"", [](const RunRecord& r) {
                              // A diverged run's accuracy is no result: no bar (the table says why).
                              return r.diverged_at_step ? std::nullopt : measured(r.final_test_accuracy);
                            }}},
                           percent_value, percent_tick));

  const std::string missing = runs_without_curves(report);
  const std::string no_curve_note = missing.empty() ? "" : "No curve for runs without epochs_detail: " + missing + ".";
  html << step_curves(report, loss_value, number_tick, plain_value);
  html << figure("Test accuracy over training time",
                 line_chart(report, "accuracy-curve", "test accuracy against cumulative training time",
                            "training time (s, cumulative over epochs)", "test accuracy", false,
                            [](const ReportRun& run) {
                              return curve_of(run.record, [](const metrics::EpochRecord& e) { return measured(e.test_accuracy); });
                            },
                            percent_value, percent_tick),
                 no_curve_note);
  if (!report.skipped.empty()) {
    html << "<h2>Files left out</h2>\n<ul>\n";
    for (const auto& file : report.skipped) html << "<li>" << escape_html(file) << "</li>\n";
    html << "</ul>\n";
  }
  html << "<script>" << kMarkCheckScript << "</script>\n</body>\n</html>\n";
  return html.str();
}

}  // namespace ptrain::report
