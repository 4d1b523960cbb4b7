#include "ptrain/report/report.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <sstream>

#include "ptrain/core/error.h"
#include "command.h"
#include "temp_dir.h"

using namespace ptrain;
using metrics::EpochRecord;
using metrics::RunRecord;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kGiB = 1024LL * 1024 * 1024;
// A run name that would be markup if a rendering forgot to escape it; also a comma and quotes for the CSV.
const std::string kHostileName = "amp-bf16 \"fast\", <script>alert(1)";
const std::string kHostileTitle = "Nightly <b>bench</b> & co";

// A fresh directory per test, kept when the test fails so that its report can be looked at.
// tests/support's TempDir, its path as a std::filesystem::path.
class ScratchDir : public ptrain::testing::TempDir {
 public:
  fs::path path() const { return dir(); }
};

RunRecord record(const std::string& framework, const std::string& strategy, const std::string& precision,
                 int64_t devices) {
  RunRecord r;
  r.framework = framework;
  r.ptrain_version = framework == "ptrain" ? "0.1.0" : "";
  r.torch_version = "2.5.1";
  r.command_line = "train " + precision;
  r.model = "resnet50";
  r.dataset = "cifar10";
  r.precision = precision;
  r.strategy = strategy;
  r.device = "cuda:0";
  r.world_size = strategy == "ddp" ? devices : 1;
  r.devices = devices;
  r.batch_size_per_device = 128;
  r.global_batch_size = 128 * devices;
  r.epochs = 2;
  r.steps = 782;
  r.image_size = 224;
  r.host_peak_rss_bytes = 3 * kGiB;
  return r;
}

EpochRecord epoch(int64_t index, double seconds, double loss, std::optional<double> test_accuracy) {
  return {index, seconds, loss, std::nullopt, test_accuracy ? std::optional<double>(0.4) : std::nullopt,
          test_accuracy, 50000 / seconds, 50000};
}

RunRecord fp32_baseline() {
  RunRecord r = record("ptrain", "single", "fp32", 1);
  r.images_per_second = 1000.0;
  r.steady_images_per_second = 1200.0;
  r.steady_from_step = 10;
  r.total_wall_seconds = 120.0;
  r.train_wall_seconds = 100.0;
  r.peak_allocated_bytes = 4 * kGiB;
  r.peak_reserved_bytes = 5 * kGiB;
  r.peak_nvml_used_bytes = 5 * kGiB;
  r.gpu_util_mean = 80.4;
  r.gpu_util_peak = 99.0;
  r.final_test_accuracy = 0.9012;
  r.epochs_detail = {epoch(0, 50.0, 1.2, 0.85), epoch(1, 50.0, 0.6, 0.9012)};
  return r;
}

RunRecord ptrain_bf16() {
  RunRecord r = record("ptrain", "single", "amp-bf16", 1);
  r.images_per_second = 2500.0;
  r.steady_images_per_second = 3000.0;  // speed-up: steady over steady, 2.5x
  r.steady_from_step = 10;
  r.total_wall_seconds = 50.0;
  r.train_wall_seconds = 40.0;
  r.peak_allocated_bytes = 2 * kGiB;
  r.peak_nvml_used_bytes = std::nullopt;  // the report must say n/a, not 0
  r.gpu_util_mean = 85.0;
  r.gpu_util_peak = 100.0;
  r.final_test_accuracy = 0.8987;
  r.tflops = 412.3;
  r.mfu = 0.4167;
  r.epochs_detail = {epoch(0, 20.0, 1.25, 0.84), epoch(1, 20.0, 0.62, 0.8987)};
  r.extra["estimate"] = {{"strategy", "single"}, {"predicted_peak_allocated_bytes", 2.25 * kGiB}};
  return r;
}

RunRecord pytorch_bf16() {
  RunRecord r = record("pytorch", "single", "amp-bf16", 1);
  r.images_per_second = 2000.0;
  r.total_wall_seconds = 62.5;
  r.train_wall_seconds = 50.0;
  r.peak_allocated_bytes = 3 * kGiB;
  r.peak_nvml_used_bytes = 4 * kGiB;
  r.final_test_accuracy = 0.8991;
  r.epochs_detail = {epoch(0, 25.0, 1.3, std::nullopt), epoch(1, 25.0, 0.65, 0.8991)};
  return r;
}

void write_json(const fs::path& path, const json& j) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path);
  out << j.dump(2);
  ASSERT_TRUE(out.good()) << path;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Two ptrain runs and one PyTorch run in two directories, as `ptrain report --runs ptrain --runs pytorch`
// would find them. The records are written as their writers write them: ptrain's baseline as an older
// record without "framework", PyTorch's without "ptrain_version".
report::WrittenReport write_three_run_report(const fs::path& dir) {
  json baseline = metrics::to_json(fp32_baseline());
  baseline.erase("framework");
  write_json(dir / "ptrain" / "fp32-baseline.json", baseline);
  write_json(dir / "ptrain" / (kHostileName + ".json"), metrics::to_json(ptrain_bf16()));
  json pytorch = metrics::to_json(pytorch_bf16());
  pytorch.erase("ptrain_version");
  write_json(dir / "pytorch" / "pytorch-amp-bf16.json", pytorch);
  return report::write_report({(dir / "ptrain").string(), (dir / "pytorch").string()}, (dir / "report").string(),
                             kHostileTitle);
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

bool has_line(const std::string& text, const std::string& line) {
  for (const auto& l : lines_of(text)) {
    if (l == line) return true;
  }
  return false;
}

// One row of a parsed CSV (rows[0] its header) as column name -> field.
std::map<std::string, std::string> csv_row(const std::vector<std::vector<std::string>>& rows, size_t row) {
  std::map<std::string, std::string> fields;
  for (size_t c = 0; c < rows[0].size(); ++c) fields[rows[0][c]] = rows[row][c];
  return fields;
}

// RFC 4180: quoted fields may hold commas, doubled quotes and line breaks.
std::vector<std::vector<std::string>> parse_csv(const std::string& text) {
  std::vector<std::vector<std::string>> rows(1);
  std::string field;
  bool quoted = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') {
        field += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        field += c;
      }
    } else if (c == '"' && field.empty()) {
      quoted = true;
    } else if (c == ',') {
      rows.back().push_back(field);
      field.clear();
    } else if (c == '\n') {
      rows.back().push_back(field);
      field.clear();
      rows.emplace_back();
    } else {
      field += c;
    }
  }
  EXPECT_FALSE(quoted) << "unterminated quoted field";
  if (rows.back().empty() && field.empty()) rows.pop_back();
  return rows;
}

// The <svg ...> start tags of every chart, by data-chart, and the marks inside each.
struct ChartInHtml {
  std::map<std::string, std::string> attributes;
  int marks = 0;
};

std::map<std::string, ChartInHtml> charts_of(const std::string& html) {
  std::map<std::string, ChartInHtml> charts;
  const std::regex svg_tag(R"(<svg\b([^>]*)>)");
  const std::regex attribute(R"(([a-z-]+)="([^"]*)\")");
  for (auto it = std::sregex_iterator(html.begin(), html.end(), svg_tag); it != std::sregex_iterator(); ++it) {
    ChartInHtml chart;
    const std::string attrs = (*it)[1];
    for (auto a = std::sregex_iterator(attrs.begin(), attrs.end(), attribute); a != std::sregex_iterator(); ++a) {
      chart.attributes[(*a)[1]] = (*a)[2];
    }
    const size_t start = static_cast<size_t>(it->position());
    const size_t end = html.find("</svg>", start);
    const std::string inside = html.substr(start, end - start);
    for (size_t at = inside.find("class=\"mark\""); at != std::string::npos; at = inside.find("class=\"mark\"", at + 1)) {
      ++chart.marks;
    }
    charts[chart.attributes["data-chart"]] = chart;
  }
  return charts;
}

const std::map<std::string, int> kExpectedMarks = {
    {"throughput", 5},      // every run, and steady for the two ptrain runs
    {"peak-memory", 5},     // allocated for all three, NVML for the two that measured it
    {"total-time", 3},      //
    {"accuracy", 3},        //
    {"loss-curve", 6},      // two epochs each
    {"accuracy-curve", 5},  // PyTorch's first epoch has no test accuracy
};

void expect_error_naming(const std::function<void()>& action, const std::vector<std::string>& fragments) {
  try {
    action();
    ADD_FAILURE() << "no error; expected one naming " << fragments.front();
  } catch (const Error& e) {
    for (const auto& fragment : fragments) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << "'" << fragment << "' not in: " << e.what();
    }
  }
}

fs::path find_headless_browser() {
  if (const char* configured = std::getenv("PTRAIN_HEADLESS_BROWSER")) {
    return ::access(configured, X_OK) == 0 ? fs::path(configured) : fs::path();
  }
  std::vector<fs::path> candidates;
  if (const char* path = std::getenv("PATH")) {
    std::istringstream dirs(path);
    for (std::string dir; std::getline(dirs, dir, ':');) {
      if (!dir.empty()) candidates.push_back(fs::path(dir) / "chromium-headless-shell");
    }
  }
  candidates.push_back("/usr/lib/chromium/chromium-headless-shell");  // Debian's real binary
  for (const auto& candidate : candidates) {
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return {};
}

// The DOM of a page after its scripts ran, as the headless browser laid it out in a window of `width` pixels.
std::string rendered_dom(const fs::path& browser, const fs::path& html, int width, const fs::path& errors) {
  const std::string command = "timeout 120 '" + browser.string() + "' --no-sandbox --disable-gpu --hide-scrollbars " +
                              "--window-size=" + std::to_string(width) + ",900 --virtual-time-budget=5000 " +
                              "--dump-dom 'file://" + fs::absolute(html).string() + "' 2>'" + errors.string() + "'";
  const auto browser_run = ptrain::testing::run_command(command, ptrain::testing::Stderr::Kept);
  EXPECT_EQ(browser_run.exit_code, 0) << command << "\n" << read_text(errors);
  return browser_run.output;
}

// Measures the runs' table where the browser laid it out, before and after scrolling it to its right end,
// into data-* attributes of <body> (pixels, rounded): added to a copy of report.html by the test alone.
const char* const kTableLayoutProbe = R"(<script>
window.addEventListener('load', function () {
  var wrap = document.querySelector('.table-wrap');
  var heads = Array.prototype.slice.call(wrap.querySelectorAll('thead th'));
  var right = function (title) {
    var th = heads.filter(function (h) { return h.textContent === title; })[0];
    return th ? th.getBoundingClientRect().right : 1e9;
  };
  var put = function (name, value) { document.body.setAttribute('data-' + name, String(Math.round(value))); };
  var box = wrap.getBoundingClientRect();
  put('viewport', window.innerWidth);
  put('overflow', wrap.scrollWidth - wrap.clientWidth);
  put('throughput-hidden', right('throughput img/s') - box.right);
  put('accuracy-hidden', right('test accuracy') - box.right);
  wrap.scrollLeft = wrap.scrollWidth;
  var cells = wrap.querySelectorAll('tbody tr:first-child td');
  put('scrolled', wrap.scrollLeft);
  put('first-left', cells[0].getBoundingClientRect().left - box.left);
  put('first-head-left', heads[0].getBoundingClientRect().left - box.left);
  put('second-left', cells[1].getBoundingClientRect().left - box.left);
  put('first-width', cells[0].getBoundingClientRect().width);
  var hit = document.elementFromPoint(box.left + 3, cells[0].getBoundingClientRect().top + 3);
  put('first-on-top', hit === cells[0] || cells[0].contains(hit) ? 1 : 0);
});
</script>
)";

std::map<std::string, double> body_measures(const std::string& dom) {
  std::map<std::string, double> measures;
  const auto body = dom.find("<body");
  const std::string tag = body == std::string::npos ? "" : dom.substr(body, dom.find('>', body) - body);
  const std::regex attribute(R"re(data-([a-z-]+)="(-?[0-9]+)")re");
  for (auto a = std::sregex_iterator(tag.begin(), tag.end(), attribute); a != std::sregex_iterator(); ++a) {
    measures[(*a)[1]] = std::stod((*a)[2]);
  }
  return measures;
}

RunRecord cpu_record(const std::string& precision) {
  RunRecord r = fp32_baseline();
  r.precision = precision;
  r.device = "cpu";
  r.peak_nvml_used_bytes.reset();
  r.gpu_util_mean.reset();
  r.gpu_util_peak.reset();
  return r;
}

}  // namespace

TEST(BenchReport, MarkdownTableHasOneRowPerRunWithSpeedupMemorySavedAndNa) {
  ScratchDir scratch;
  const report::WrittenReport written = write_three_run_report(scratch.path());
  EXPECT_EQ(read_text(written.markdown_path), written.markdown);
  const std::string& md = written.markdown;

  EXPECT_TRUE(has_line(md, "# Nightly \\<b\\>bench\\</b\\> & co")) << md;
  EXPECT_TRUE(has_line(md,
                       "| run | framework | strategy | precision | devices | batch/device | throughput img/s | steady img/s | "
                       "speed-up vs baseline | test accuracy | peak allocated/GPU | memory saved vs baseline | "
                       "predicted peak/GPU | peak NVML used/GPU | GPU util mean | GPU util peak | total time | training time | MFU |"))
      << md;
  // Runs ordered by devices, strategy and precision (fp32 before the mixed modes), ptrain before PyTorch.
  EXPECT_TRUE(has_line(md,
                       "| amp-bf16 \"fast\", \\<script\\>alert(1) | ptrain | single | amp-bf16 | 1 | 128 | 2500 | 3000 | "
                       "2.50x | 89.87% | 2.00 GiB | 50.0% | 2.25 GiB | n/a | 85% | 100% | 50.0 s | 40.0 s | 41.67% |"))
      << md;
  EXPECT_TRUE(has_line(md,
                       "| fp32-baseline | ptrain | single | fp32 | 1 | 128 | 1000 | 1200 | 1.00x | 90.12% | 4.00 GiB | 0.0% | "
                       "n/a | 5.00 GiB | 80% | 99% | 2 min 00 s | 1 min 40 s | n/a |"))
      << md;
  EXPECT_TRUE(has_line(md,
                       "| pytorch-amp-bf16 | pytorch | single | amp-bf16 | 1 | 128 | 2000 | n/a | 2.00x | 89.91% | 3.00 GiB | "
                       "25.0% | n/a | 4.00 GiB | n/a | n/a | 1 min 03 s | 50.0 s | n/a |"))
      << md;
  EXPECT_TRUE(has_line(md, "Baseline: fp32-baseline (the ptrain single-device fp32 run).")) << md;
  EXPECT_EQ(md.find("<script>"), std::string::npos);

  const std::vector<std::string> lines = lines_of(md.substr(0, md.find("\n## ")));  // the runs' table
  const auto table_rows = std::count_if(lines.begin(), lines.end(), [](const std::string& l) { return l.rfind("| ", 0) == 0; });
  EXPECT_EQ(table_rows, 2 + 3);  // header, alignment row, one row per run
}

TEST(BenchReport, CsvHasTheSameColumnsAsPlainNumbersAndEmptyForMissing) {
  ScratchDir scratch;
  const report::WrittenReport written = write_three_run_report(scratch.path());
  const auto rows = parse_csv(read_text(written.csv_path));
  ASSERT_EQ(rows.size(), 4u);
  const std::vector<std::string> header = {
      "run", "framework", "strategy", "precision", "devices", "batch_size_per_device", "images_per_second",
      "steady_images_per_second", "speedup_vs_baseline", "final_test_accuracy", "peak_allocated_bytes_per_gpu",
      "memory_saved_vs_baseline_fraction", "predicted_peak_allocated_bytes_per_gpu", "peak_nvml_used_bytes_per_gpu",
      "gpu_util_mean_percent", "gpu_util_peak_percent", "total_wall_seconds", "train_wall_seconds", "diverged_at_step", "mfu",
      "steady_step_median_seconds", "steady_step_p10_seconds", "steady_step_p90_seconds", "bench_repeat",
      "load_average_before", "load_average_after"};
  EXPECT_EQ(rows[0], header);
  for (const auto& row : rows) EXPECT_EQ(row.size(), header.size());

  std::map<std::string, std::map<std::string, std::string>> by_run;
  for (size_t r = 1; r < rows.size(); ++r) {
    for (size_t c = 0; c < header.size(); ++c) by_run[rows[r][0]][header[c]] = rows[r][c];
  }
  ASSERT_EQ(by_run.count(kHostileName), 1u) << "the quoted run name did not survive";
  const auto& bf16 = by_run[kHostileName];
  EXPECT_EQ(bf16.at("peak_allocated_bytes_per_gpu"), std::to_string(2 * kGiB));
  EXPECT_EQ(bf16.at("peak_nvml_used_bytes_per_gpu"), "");
  EXPECT_DOUBLE_EQ(std::stod(bf16.at("predicted_peak_allocated_bytes_per_gpu")), 2.25 * kGiB);
  EXPECT_EQ(by_run.at("fp32-baseline").at("predicted_peak_allocated_bytes_per_gpu"), "");
  EXPECT_EQ(bf16.at("total_wall_seconds"), "50");
  EXPECT_EQ(bf16.at("images_per_second"), "2500");
  EXPECT_EQ(bf16.at("steady_images_per_second"), "3000");
  EXPECT_DOUBLE_EQ(std::stod(bf16.at("speedup_vs_baseline")), 2.5);
  EXPECT_DOUBLE_EQ(std::stod(bf16.at("memory_saved_vs_baseline_fraction")), 0.5);
  EXPECT_DOUBLE_EQ(std::stod(bf16.at("final_test_accuracy")), 0.8987);
  EXPECT_DOUBLE_EQ(std::stod(bf16.at("mfu")), 0.4167);
  EXPECT_EQ(by_run.at("fp32-baseline").at("mfu"), "") << "a record without a peak has no MFU";
  const auto& pytorch = by_run.at("pytorch-amp-bf16");
  EXPECT_EQ(pytorch.at("framework"), "pytorch");
  EXPECT_EQ(pytorch.at("gpu_util_mean_percent"), "");
  EXPECT_EQ(pytorch.at("steady_images_per_second"), "") << "a record without a steady figure";
  EXPECT_EQ(pytorch.at("gpu_util_peak_percent"), "");
  EXPECT_DOUBLE_EQ(std::stod(pytorch.at("total_wall_seconds")), 62.5);
  EXPECT_DOUBLE_EQ(std::stod(pytorch.at("speedup_vs_baseline")), 2.0);
  EXPECT_DOUBLE_EQ(std::stod(pytorch.at("memory_saved_vs_baseline_fraction")), 0.25);
  EXPECT_DOUBLE_EQ(std::stod(by_run.at("fp32-baseline").at("gpu_util_mean_percent")), 80.4);
}

TEST(BenchReport, HtmlHasEveryChartWithItsMarksEscapedAndSelfContained) {
  ScratchDir scratch;
  const report::WrittenReport written = write_three_run_report(scratch.path());
  const std::string html = read_text(written.html_path);

  const auto charts = charts_of(html);
  ASSERT_EQ(charts.size(), kExpectedMarks.size()) << html;
  for (const auto& [name, expected] : kExpectedMarks) {
    ASSERT_EQ(charts.count(name), 1u) << "no chart " << name;
    EXPECT_EQ(charts.at(name).marks, expected) << name;
    EXPECT_EQ(charts.at(name).attributes.at("data-marks"), std::to_string(expected)) << name;
  }

  EXPECT_NE(html.find("<title>Nightly &lt;b&gt;bench&lt;/b&gt; &amp; co</title>"), std::string::npos);
  EXPECT_NE(html.find("amp-bf16 &quot;fast&quot;, &lt;script&gt;alert(1)"), std::string::npos);
  EXPECT_EQ(html.find("<script>alert"), std::string::npos);
  EXPECT_EQ(html.find("<b>bench"), std::string::npos);
  size_t script_tags = 0;
  for (size_t at = html.find("<script"); at != std::string::npos; at = html.find("<script", at + 1)) ++script_tags;
  EXPECT_EQ(script_tags, 1u) << "only the page's own mark-counting script";

  // Nothing to fetch: no links, sources or stylesheets, and no URL but SVG's namespace name.
  for (const std::string reference : {"src=", "href=", "<link", "url(", "@import"}) {
    EXPECT_EQ(html.find(reference), std::string::npos) << reference;
  }
  const std::string html_without_namespace =
      std::regex_replace(html, std::regex(R"(xmlns="http://www\.w3\.org/2000/svg")"), "");
  EXPECT_EQ(html_without_namespace.find("http"), std::string::npos);

  // ptrain and PyTorch bars differ in colour, and the legend says which is which.
  const std::string throughput = html.substr(html.find("data-chart=\"throughput\""));
  EXPECT_NE(throughput.find("fill=\"#2563eb\""), std::string::npos);
  EXPECT_NE(throughput.find("fill=\"#ee4c2c\""), std::string::npos);
  EXPECT_NE(throughput.find(">PyTorch</text>"), std::string::npos);
  EXPECT_NE(throughput.find(">ptrain</text>"), std::string::npos);
  // The table's missing values are n/a there too.
  EXPECT_NE(html.find("<td class=\"number\">n/a</td>"), std::string::npos);
}

TEST(BenchReport, WithoutSingleDeviceFp32TheFirstRunIsTheBaselineAndRunsWithoutEpochsHaveNoCurve) {
  ScratchDir scratch;
  RunRecord ddp = fp32_baseline();
  ddp.strategy = "ddp";
  ddp.world_size = ddp.devices = 2;
  ddp.global_batch_size = 256;
  ddp.images_per_second = 1800.0;
  ddp.final_test_accuracy.reset();
  ddp.epochs_detail.clear();
  write_json(scratch.path() / "runs" / "a-ddp.json", metrics::to_json(ddp));
  write_json(scratch.path() / "runs" / "b-pytorch.json", metrics::to_json(pytorch_bf16()));
  const auto written = report::write_report({(scratch.path() / "runs").string()},
                                           (scratch.path() / "out").string(), "fallback");

  EXPECT_TRUE(has_line(written.markdown,
                       "Baseline: a-ddp (ptrain, ddp, fp32, 2 devices, batch 128/device; no ptrain single-device fp32 "
                       "run among these records, so the first ptrain run)."))
      << written.markdown;
  EXPECT_TRUE(has_line(written.markdown,
                       "| a-ddp | ptrain | ddp | fp32 | 2 | 128 | 1800 | 1200 | 1.00x | n/a | 4.00 GiB | 0.0% | n/a | "
                       "5.00 GiB | 80% | 99% | 2 min 00 s | 1 min 40 s | n/a |"))
      << written.markdown;
  EXPECT_NE(written.markdown.find("| 2000 | n/a | 1.11x | 89.91% | 3.00 GiB | 25.0% |"), std::string::npos)
      << written.markdown;

  const std::string html = read_text(written.html_path);
  const auto charts = charts_of(html);
  EXPECT_EQ(charts.at("loss-curve").marks, 2);
  EXPECT_EQ(charts.at("accuracy-curve").marks, 1);
  EXPECT_EQ(charts.at("accuracy").marks, 1);
  EXPECT_NE(html.find("No curve for runs without epochs_detail: a-ddp."), std::string::npos);
  EXPECT_NE(html.find("no ptrain single-device fp32 run among these records"), std::string::npos);
}

// Two jobs in one report: each run's speed-up and memory saved are against its own job's baseline, a job without a
// single-device fp32 run taking its first ptrain run and saying so, and both baselines are marked.
TEST(BenchReport, EachJobIsMeasuredAgainstItsOwnBaseline) {
  ScratchDir scratch;
  const auto runs = scratch.path() / "runs";
  write_json(runs / "resnet-fp32.json", metrics::to_json(fp32_baseline()));  // steady 1200, 4 GiB
  write_json(runs / "resnet-bf16.json", metrics::to_json(ptrain_bf16()));    // steady 3000, 2 GiB
  const auto gpt = [](const std::string& strategy, double steady, int64_t peak_gib) {
    RunRecord r = record("ptrain", strategy, "amp-bf16", 1);
    r.model = "gpt-small";
    r.dataset = "synthetic-tokens";
    r.image_size = 0;
    r.seq_len = 1024;
    r.batch_size_per_device = 16;
    r.images_per_second = steady;
    r.steady_images_per_second = steady;
    r.steady_from_step = 10;
    r.peak_allocated_bytes = peak_gib * kGiB;
    return r;
  };
  write_json(runs / "gpt-single.json", metrics::to_json(gpt("single", 400, 10)));
  write_json(runs / "gpt-zero3.json", metrics::to_json(gpt("zero3", 380, 8)));
  const auto written = report::write_report({runs.string()}, (scratch.path() / "out").string(), "two jobs");
  const std::string& md = written.markdown;
  const auto row_of = [&](const std::string& name) {
    const auto at = md.find("| " + name + " |");
    return at == std::string::npos ? std::string() : md.substr(at, md.find('\n', at) - at);
  };
  EXPECT_NE(row_of("resnet-fp32").find("| 1.00x |"), std::string::npos) << md;
  EXPECT_NE(row_of("resnet-bf16").find("| 2.50x |"), std::string::npos) << md;
  EXPECT_NE(row_of("resnet-bf16").find("| 50.0% |"), std::string::npos) << md;
  EXPECT_NE(row_of("gpt-single").find("| 1.00x |"), std::string::npos) << md;
  EXPECT_NE(row_of("gpt-zero3").find("| 0.95x |"), std::string::npos) << md;
  EXPECT_NE(row_of("gpt-zero3").find("| 20.0% |"), std::string::npos) << md;
  EXPECT_NE(md.find("The runs train 2 jobs, and each run's speed-up and memory saved are against its own job's "
                    "baseline: gpt-single (ptrain, single, amp-bf16, 1 device, batch 16/device; no ptrain single-device "
                    "fp32 run of gpt-small on synthetic-tokens at 1024 tokens, so the first ptrain run); resnet-fp32 "
                    "(the ptrain single-device fp32 run)."),
            std::string::npos)
      << md;
  const std::string html = read_text(written.html_path);
  size_t marked = 0;
  for (auto at = html.find("<tr class=\"baseline\""); at != std::string::npos;
       at = html.find("<tr class=\"baseline\"", at + 1))
    ++marked;
  EXPECT_EQ(marked, 2u);
}

// A ptrain run's --log-jsonl beside its record (as the runner writes it) gives its loss curve a point for
// every logged step and a throughput curve; a run without one keeps a point an epoch, at the epoch's last step.
TEST(BenchReport, LossAndThroughputCurvesComeFromTheStepLogBesideTheRecord) {
  ScratchDir scratch;
  const fs::path runs = scratch.path() / "runs";
  write_json(runs / "a-fp32.json", metrics::to_json(fp32_baseline()));
  write_json(runs / "b-bf16.json", metrics::to_json(ptrain_bf16()));
  {
    std::ofstream log(runs / "a-fp32.log.jsonl");
    log << R"({"kind":"step","step":50,"epoch":0.1,"wall_time":1.0,"train/loss":2.25,"train/images_per_s":900.5})"
        << "\n"
        << R"({"kind":"step","step":100,"epoch":0.2,"wall_time":2.0,"train/loss":1.75,"train/images_per_s":1100})"
        << "\n"
        << R"({"kind":"epoch","step":390,"epoch":1.0,"wall_time":3.0,"eval/loss":1.5,"eval/accuracy":0.5})" << "\n"
        << R"({"kind":"step","step":440,"epoch":1.1,"wall_time":4.0,"train/loss":null,"train/images_per_s":1000})"
        << "\n"
        << R"({"kind":"step","step":490,"epoch":1.2,"wall_time":5.0,"train/loss":0.625,"train/images_per_s":1200})"
        << "\n"
        << R"({"kind":"step","st)";  // the line a kill cut short
  }
  const auto written = report::write_report({runs.string()}, (scratch.path() / "out").string(), "logged");
  const std::string html = read_text(written.html_path);
  const auto charts = charts_of(html);
  // a-fp32: its three finite logged losses, not its two epochs; b-bf16: its two epochs.
  EXPECT_EQ(charts.at("loss-curve").marks, 3 + 2);
  EXPECT_EQ(charts.at("throughput-curve").marks, 4) << "a-fp32's logged steps; b-bf16 logged none";
  for (const char* point : {"a-fp32, step 50: 2.2500", "a-fp32, step 100: 1.7500", "a-fp32, step 490: 0.6250",
                            "b-bf16, step 390 (epoch 0&#39;s mean): 1.2500", "b-bf16, step 781 (epoch 1&#39;s mean): 0.6200",
                            "a-fp32, step 440 (images/s): "}) {
    EXPECT_NE(html.find(point), std::string::npos) << point;
  }
  const size_t loss_chart = html.find("data-chart=\"loss-curve\"");
  ASSERT_NE(loss_chart, std::string::npos);
  const std::string loss_svg = html.substr(loss_chart, html.find("</svg>", loss_chart) - loss_chart);
  EXPECT_EQ(loss_svg.find("a-fp32, step 390"), std::string::npos) << "a logged run's loss has no epoch points";
  EXPECT_NE(loss_svg.find(">optimizer step</text>"), std::string::npos);
  EXPECT_NE(html.find("Every logged step (--log-jsonl) of a-fp32"), std::string::npos);
}

TEST(BenchReport, MissingOrEmptyDirectoryIsAnErrorNamingIt) {
  ScratchDir scratch;
  const fs::path empty = scratch.path() / "empty";
  fs::create_directories(empty);
  std::ofstream(empty / "notes.txt") << "not a record";
  const std::string out = (scratch.path() / "out").string();
  expect_error_naming([&] { report::write_report({empty.string()}, out, "t"); }, {empty.string(), "no run record"});
  const fs::path missing = scratch.path() / "missing";
  expect_error_naming([&] { report::write_report({missing.string()}, out, "t"); }, {missing.string(), "does not exist"});
  EXPECT_FALSE(fs::exists(out)) << "a failed report must not leave a half-written directory";
}

// A bench's bench.json and an estimate's JSON beside the records are left out and named, in the report and in
// what it returns; a directory of such files alone holds no run record, and the error names them.
TEST(BenchReport, JsonFilesThatAreNotRunRecordsAreLeftOutAndNamed) {
  ScratchDir scratch;
  const fs::path runs = scratch.path() / "runs";
  write_json(runs / "fp32.json", metrics::to_json(fp32_baseline()));
  write_json(runs / "bench.json", json{{"suite", "standard"}, {"runs", json::array()}});
  write_json(runs / "estimate" / "resnet.json", json::array({json{{"predicted_peak_allocated_bytes", 1}}}));
  const auto written = report::write_report({runs.string()}, (scratch.path() / "out").string(), "t");
  ASSERT_EQ(written.skipped.size(), 2u);
  EXPECT_EQ(written.skipped[0], (runs / "bench.json").string() +
                                    " (not a run record: no schema_version and epochs_detail keys)");
  EXPECT_EQ(written.skipped[1].rfind((runs / "estimate" / "resnet.json").string(), 0), 0u) << written.skipped[1];
  EXPECT_TRUE(has_line(written.markdown, "## Files left out")) << written.markdown;
  EXPECT_NE(written.markdown.find("bench.json (not a run record"), std::string::npos) << written.markdown;
  EXPECT_NE(read_text(written.html_path).find("<h2>Files left out</h2>"), std::string::npos);
  EXPECT_NE(written.markdown.find("| fp32 |"), std::string::npos) << "the run record is still reported";

  const fs::path foreign = scratch.path() / "foreign";
  write_json(foreign / "bench.json", json{{"suite", "standard"}});
  expect_error_naming([&] { report::write_report({foreign.string()}, (scratch.path() / "out2").string(), "t"); },
                      {foreign.string(), "no run record", (foreign / "bench.json").string()});
}

TEST(BenchReport, MalformedRecordIsAnErrorNamingTheFileAndTheKey) {
  ScratchDir scratch;
  const fs::path runs = scratch.path() / "runs";
  const std::string out = (scratch.path() / "out").string();
  json wrong_type = metrics::to_json(fp32_baseline());
  wrong_type["images_per_second"] = "fast";
  write_json(runs / "wrong-type.json", wrong_type);
  expect_error_naming([&] { report::write_report({runs.string()}, out, "t"); },
                      {(runs / "wrong-type.json").string(), "'images_per_second'"});

  ptrain::testing::remove_tree(runs);
  json unknown_framework = metrics::to_json(fp32_baseline());
  unknown_framework["framework"] = "tensorflow";
  write_json(runs / "tf.json", unknown_framework);
  expect_error_naming([&] { report::write_report({runs.string()}, out, "t"); },
                      {(runs / "tf.json").string(), "'framework'", "tensorflow"});

  ptrain::testing::remove_tree(runs);
  json ptrain_without_version = metrics::to_json(fp32_baseline());
  ptrain_without_version.erase("ptrain_version");
  write_json(runs / "no-version.json", ptrain_without_version);
  expect_error_naming([&] { report::write_report({runs.string()}, out, "t"); },
                      {(runs / "no-version.json").string(), "'ptrain_version'"});

  ptrain::testing::remove_tree(runs);
  fs::create_directories(runs);
  std::ofstream(runs / "truncated.json") << "{\"schema_version\": 1, \"model\": ";
  expect_error_naming([&] { report::write_report({runs.string()}, out, "t"); },
                      {(runs / "truncated.json").string(), "not valid JSON"});
}

TEST(BenchReport, RunsOfTheSameNameInTwoDirectoriesAreTold) {
  ScratchDir scratch;
  write_json(scratch.path() / "monday" / "fp32.json", metrics::to_json(fp32_baseline()));
  write_json(scratch.path() / "tuesday" / "fp32.json", metrics::to_json(ptrain_bf16()));
  const auto runs = report::read_runs({(scratch.path() / "monday").string(), (scratch.path() / "tuesday/").string()});
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0].name, "monday/fp32");
  EXPECT_EQ(runs[1].name, "tuesday/fp32");
}

// ptrain beside PyTorch eager (same memory format) and PyTorch compiled, per model and mode, with the ratios
// and each one's peak memory; in tokens for language models.
RunRecord speed_record(const std::string& framework, const std::string& model, const std::string& precision,
                       double steady, int64_t peak_gib) {
  RunRecord r = record(framework, "single", precision, 1);
  r.model = model;
  r.images_per_second = steady * 0.9;
  r.steady_images_per_second = steady;
  r.steady_from_step = 10;
  r.peak_allocated_bytes = peak_gib * kGiB;
  r.peak_nvml_used_bytes = (peak_gib + 2) * kGiB;
  if (model == "gpt-small") {
    r.dataset = "synthetic-tokens";
    r.image_size = 0;
    r.batch_size_per_device = 16;
    r.seq_len = 1024;
    r.tokens_per_second = r.images_per_second * 1024;
    r.steady_tokens_per_second = steady * 1024;
  }
  return r;
}

void write_speed_runs(const fs::path& runs) {
  RunRecord ptrain = speed_record("ptrain", "resnet50", "amp-bf16", 4400, 5);
  ptrain.channels_last = true;
  write_json(runs / "ptrain" / "resnet50" / "amp-bf16.json", metrics::to_json(ptrain));
  RunRecord eager = speed_record("pytorch", "resnet50", "amp-bf16+channels-last", 4000, 6);
  eager.channels_last = true;
  eager.compiled = false;
  write_json(runs / "pytorch" / "resnet50" / "amp-bf16.json", metrics::to_json(eager));
  RunRecord compiled = speed_record("pytorch", "resnet50", "amp-bf16+channels-last", 5500, 5);
  compiled.peak_allocated_bytes = static_cast<int64_t>(5.5 * kGiB);
  compiled.peak_nvml_used_bytes = static_cast<int64_t>(3.25 * kGiB);  // below its allocated peak: sampled, it can miss it
  compiled.channels_last = true;
  compiled.compiled = true;
  compiled.fused_optimizer = true;
  write_json(runs / "pytorch-compiled" / "resnet50" / "amp-bf16.json", metrics::to_json(compiled));
  // An older eager record in NCHW, before the channels_last field: a row of its own, without ptrain.
  json nchw = metrics::to_json(speed_record("pytorch", "resnet50", "amp-bf16", 2200, 7));
  for (const char* key : {"channels_last", "compiled", "fused_optimizer", "seq_len", "tokens_per_second",
                          "steady_tokens_per_second"}) {
    nchw.erase(key);
  }
  write_json(runs / "old" / "pytorch-nchw.json", nchw);
  write_json(runs / "ptrain" / "gpt-small" / "fp32.json",
             metrics::to_json(speed_record("ptrain", "gpt-small", "fp32", 20, 9)));
  write_json(runs / "pytorch" / "gpt-small" / "fp32.json",
             metrics::to_json(speed_record("pytorch", "gpt-small", "fp32", 16, 8)));
  // ptrain alone: nothing to compare, no row.
  write_json(runs / "ptrain" / "resnet50" / "fp32.json", metrics::to_json(fp32_baseline()));
}

TEST(BenchReport, SideBySidePutsPtrainBesidePytorchEagerAndCompiledWithRatiosAndPeaks) {
  ScratchDir scratch;
  write_speed_runs(scratch.path() / "runs");
  const auto written = report::write_report({(scratch.path() / "runs").string()}, (scratch.path() / "out").string(),
                                           "speed");
  const std::string& md = written.markdown;
  EXPECT_TRUE(has_line(md, "## ptrain beside PyTorch")) << md;
  // One compile mode: its columns name it (a record without extra.compile.mode ran the default).
  EXPECT_TRUE(has_line(md, "| model | data | precision | devices | memory format | ptrain | PyTorch eager | "
                           "PyTorch compiled (default) | ptrain / eager | ptrain / compiled (default) | ptrain peak/GPU | "
                           "eager peak/GPU | compiled (default) peak/GPU | ptrain device/GPU | eager device/GPU | "
                           "compiled (default) device/GPU |"))
      << md;
  const std::string gpt = "| gpt-small | synthetic-tokens, 1024 tokens, batch 16 | fp32 | 1, single | - | "
                          "20480 tokens/s | 16384 tokens/s | n/a | 1.25x | n/a | 9.00 GiB | 8.00 GiB | n/a | 11.00 GiB | "
                          "10.00 GiB | n/a |";
  const std::string nchw = "| resnet50 | cifar10, 224 px, batch 128 | amp-bf16 | 1, single | NCHW | n/a | 2200 img/s | "
                           "5500 img/s | n/a | n/a | n/a | 7.00 GiB | 5.50 GiB | n/a | 9.00 GiB | 3.25 GiB |";
  const std::string nhwc = "| resnet50 | cifar10, 224 px, batch 128 | amp-bf16 | 1, single | channels-last | 4400 img/s | "
                           "4000 img/s | 5500 img/s | 1.10x | 0.80x | 5.00 GiB | 6.00 GiB | 5.50 GiB | 7.00 GiB | 8.00 GiB | "
                           "3.25 GiB |";
  for (const auto& row : {gpt, nchw, nhwc}) EXPECT_TRUE(has_line(md, row)) << row << "\n" << md;
  EXPECT_LT(md.find(gpt), md.find(nchw));
  EXPECT_LT(md.find(nchw), md.find(nhwc));
  EXPECT_EQ(md.find("| resnet50 | cifar10, 224 px, batch 128 | fp32 |"), std::string::npos) << "ptrain alone has no row";
  EXPECT_NE(md.find("gpt-small on synthetic-tokens (1024 tokens)"), std::string::npos) << md;

  ASSERT_EQ(written.side_by_side_csv_path, (scratch.path() / "out" / "side-by-side.csv").string());
  const auto rows = parse_csv(read_text(written.side_by_side_csv_path));
  ASSERT_EQ(rows.size(), 4u);
  const auto row = csv_row(rows, 3);
  EXPECT_EQ(row.at("model"), "resnet50");
  EXPECT_EQ(row.at("channels_last"), "true");
  EXPECT_EQ(row.at("throughput_unit"), "images");
  EXPECT_EQ(row.at("ptrain_per_second"), "4400");
  EXPECT_EQ(row.at("pytorch_eager_per_second"), "4000");
  EXPECT_EQ(row.at("pytorch_compiled_per_second"), "5500");
  EXPECT_DOUBLE_EQ(std::stod(row.at("ptrain_vs_pytorch_eager")), 1.1);
  EXPECT_DOUBLE_EQ(std::stod(row.at("ptrain_vs_pytorch_compiled")), 0.8);
  EXPECT_EQ(row.at("pytorch_compiled_peak_allocated_bytes"), std::to_string(static_cast<int64_t>(5.5 * kGiB)));
  EXPECT_EQ(row.at("ptrain_peak_nvml_used_bytes"), std::to_string(7 * kGiB));
  EXPECT_EQ(row.at("pytorch_eager_peak_nvml_used_bytes"), std::to_string(8 * kGiB));
  EXPECT_EQ(row.at("pytorch_compiled_peak_nvml_used_bytes"), std::to_string(static_cast<int64_t>(3.25 * kGiB)));
  EXPECT_EQ(row.at("ptrain_run"), "ptrain/resnet50/amp-bf16");
  EXPECT_EQ(row.at("pytorch_compiled_run"), "pytorch-compiled/resnet50/amp-bf16");
  EXPECT_EQ(row.at("pytorch_compiled_mode"), "default");
  EXPECT_EQ(rows[0].size(), 36u) << "one compile mode: no columns of another (28, and 8 of the ratios' ranges)";
  const auto tokens = csv_row(rows, 1);
  EXPECT_EQ(tokens.at("pytorch_compiled_mode"), "") << "no compiled run in the row";
  EXPECT_EQ(tokens.at("throughput_unit"), "tokens");
  EXPECT_EQ(tokens.at("seq_len"), "1024");
  EXPECT_EQ(tokens.at("ptrain_per_second"), "20480");
  EXPECT_EQ(tokens.at("pytorch_compiled_per_second"), "");
  EXPECT_EQ(tokens.at("ptrain_vs_pytorch_compiled"), "");

  const std::string html = read_text(written.html_path);
  EXPECT_NE(html.find("<h2>ptrain beside PyTorch</h2>"), std::string::npos);
  EXPECT_NE(html.find("<th>PyTorch compiled (default)</th>"), std::string::npos);
  EXPECT_NE(html.find("<td class=\"number\">4400 img/s</td><td class=\"number\">4000 img/s</td><td class=\"number\">"
                      "5500 img/s</td><td class=\"number\">1.10x</td><td class=\"number\">0.80x</td>"),
            std::string::npos);
  EXPECT_NE(md.find("PyTorch compiled is torch.compile (default mode)"), std::string::npos) << md;
}

// The note under the table says which torch.compile mode the compiled records ran (extra.compile.mode).
TEST(BenchReport, SideBySideNoteNamesTheCompileModeTheRecordsRan) {
  ScratchDir scratch;
  write_speed_runs(scratch.path() / "runs");
  const fs::path compiled_path = scratch.path() / "runs" / "pytorch-compiled" / "resnet50" / "amp-bf16.json";
  json compiled = json::parse(read_text(compiled_path.string()));
  compiled["extra"]["compile"] = {{"mode", "reduce-overhead"}, {"graphs", 2}};
  write_json(compiled_path, compiled);
  const auto written = report::write_report({(scratch.path() / "runs").string()}, (scratch.path() / "out").string(),
                                           "speed");
  const std::string note = "PyTorch compiled is torch.compile (mode reduce-overhead: forward and backward replayed "
                           "as CUDA graphs)";
  EXPECT_NE(written.markdown.find(note), std::string::npos) << written.markdown;
  EXPECT_EQ(written.markdown.find("default mode"), std::string::npos) << written.markdown;
  EXPECT_NE(read_text(written.html_path).find(note), std::string::npos);
}

// PyTorch compiled in two modes (the speed suite's reduce-overhead, and the default mode of its targets): the
// table gains a throughput, ratio, peak and device column for the second mode, each named with its mode, the
// mode with more records first; side-by-side.csv keeps its columns for that one and adds the second's.
TEST(BenchReport, SideBySideGivesEachCompileModeItsOwnColumns) {
  ScratchDir scratch;
  const fs::path runs = scratch.path() / "runs";
  write_speed_runs(runs);
  const fs::path graphs_path = runs / "pytorch-compiled" / "resnet50" / "amp-bf16.json";
  json graphs = json::parse(read_text(graphs_path.string()));
  graphs["extra"]["compile"] = {{"mode", "reduce-overhead"}, {"graphs", 2}};
  write_json(graphs_path, graphs);
  RunRecord gpt_graphs = speed_record("pytorch", "gpt-small", "fp32", 32, 10);
  gpt_graphs.compiled = true;
  gpt_graphs.extra["compile"] = {{"mode", "reduce-overhead"}};
  write_json(runs / "pytorch-compiled" / "gpt-small" / "fp32.json", metrics::to_json(gpt_graphs));
  RunRecord plain = speed_record("pytorch", "resnet50", "amp-bf16+channels-last", 5000, 6);
  plain.channels_last = true;
  plain.compiled = true;
  plain.peak_nvml_used_bytes = static_cast<int64_t>(6.5 * kGiB);
  plain.extra["compile"] = {{"mode", "default"}, {"graphs", 1}};
  write_json(runs / "pytorch-compiled-default" / "resnet50" / "amp-bf16.json", metrics::to_json(plain));

  const auto written = report::write_report({runs.string()}, (scratch.path() / "out").string(), "modes");
  const std::string& md = written.markdown;
  EXPECT_TRUE(has_line(md, "| model | data | precision | devices | memory format | ptrain | PyTorch eager | "
                           "PyTorch compiled (reduce-overhead) | PyTorch compiled (default) | ptrain / eager | "
                           "ptrain / compiled (reduce-overhead) | ptrain / compiled (default) | ptrain peak/GPU | "
                           "eager peak/GPU | compiled (reduce-overhead) peak/GPU | compiled (default) peak/GPU | "
                           "ptrain device/GPU | eager device/GPU | compiled (reduce-overhead) device/GPU | "
                           "compiled (default) device/GPU |"))
      << md;
  EXPECT_TRUE(has_line(md, "| resnet50 | cifar10, 224 px, batch 128 | amp-bf16 | 1, single | channels-last | "
                           "4400 img/s | 4000 img/s | 5500 img/s | 5000 img/s | 1.10x | 0.80x | 0.88x | 5.00 GiB | "
                           "6.00 GiB | 5.50 GiB | 6.00 GiB | 7.00 GiB | 8.00 GiB | 3.25 GiB | 6.50 GiB |"))
      << md;
  EXPECT_TRUE(has_line(md, "| gpt-small | synthetic-tokens, 1024 tokens, batch 16 | fp32 | 1, single | - | "
                           "20480 tokens/s | 16384 tokens/s | 32768 tokens/s | n/a | 1.25x | 0.62x | n/a | 9.00 GiB | "
                           "8.00 GiB | 10.00 GiB | n/a | 11.00 GiB | 10.00 GiB | 12.00 GiB | n/a |"))
      << md;
  EXPECT_NE(md.find("torch.compile (in the mode each of its columns names; reduce-overhead: forward and backward "
                    "replayed as CUDA graphs)"),
            std::string::npos)
      << md;

  const auto rows = parse_csv(read_text(written.side_by_side_csv_path));
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0].size(), 46u) << "six columns for the second mode, and four of its ratio's range";
  const auto resnet = csv_row(rows, 3);
  EXPECT_EQ(resnet.at("pytorch_compiled_mode"), "reduce-overhead");
  EXPECT_EQ(resnet.at("pytorch_compiled_per_second"), "5500");
  EXPECT_EQ(resnet.at("pytorch_compiled_run"), "pytorch-compiled/resnet50/amp-bf16");
  EXPECT_EQ(resnet.at("pytorch_compiled_default_per_second"), "5000");
  EXPECT_DOUBLE_EQ(std::stod(resnet.at("ptrain_vs_pytorch_compiled_default")), 0.88);
  EXPECT_EQ(resnet.at("pytorch_compiled_default_peak_allocated_bytes"), std::to_string(6 * kGiB));
  EXPECT_EQ(resnet.at("pytorch_compiled_default_peak_nvml_used_bytes"), std::to_string(static_cast<int64_t>(6.5 * kGiB)));
  EXPECT_EQ(resnet.at("pytorch_compiled_default_run"), "pytorch-compiled-default/resnet50/amp-bf16");
  EXPECT_EQ(resnet.at("pytorch_compiled_default_diverged_at_step"), "");
  const auto gpt = csv_row(rows, 1);
  EXPECT_EQ(gpt.at("pytorch_compiled_mode"), "reduce-overhead");
  EXPECT_EQ(gpt.at("pytorch_compiled_default_per_second"), "");
  EXPECT_EQ(gpt.at("pytorch_compiled_default_run"), "");

  const std::string html = read_text(written.html_path);
  EXPECT_NE(html.find("<th>PyTorch compiled (reduce-overhead)</th><th>PyTorch compiled (default)</th>"),
            std::string::npos);
  EXPECT_NE(html.find("<td class=\"number\">5500 img/s</td><td class=\"number\">5000 img/s</td>"), std::string::npos);
}

// A batch-size sweep: each batch a row of its own, the rows of one mode one under the other, the batch in
// the data cell and in side-by-side.csv; ratios within a batch.
TEST(BenchReport, SideBySideKeepsEachBatchOfASweepInARowOfItsOwnUnderTheOthersOfItsMode) {
  ScratchDir scratch;
  const fs::path runs = scratch.path() / "runs";
  const auto at_batch = [](RunRecord r, int64_t batch) {
    r.batch_size_per_device = batch;
    r.global_batch_size = batch;
    r.channels_last = true;
    return r;
  };
  for (const auto& [precision, steady] : {std::pair<std::string, double>{"fp32", 1000}, {"amp-bf16", 4400}}) {
    for (const int64_t batch : {128, 256}) {
      const std::string name = precision + "-b" + std::to_string(batch) + ".json";
      const double faster = batch == 256 ? 1.25 : 1.0;
      write_json(runs / "ptrain" / name,
                 metrics::to_json(at_batch(speed_record("ptrain", "resnet50", precision, steady * faster, 5), batch)));
      RunRecord eager = at_batch(speed_record("pytorch", "resnet50", precision, steady * 0.8, 6), batch);
      eager.compiled = false;
      write_json(runs / "pytorch" / name, metrics::to_json(eager));
    }
  }
  const auto written = report::write_report({runs.string()}, (scratch.path() / "out").string(), "sweep");
  const std::string& md = written.markdown;
  const std::vector<std::string> expected{
      "| resnet50 | cifar10, 224 px, batch 128 | fp32 | 1, single | channels-last | 1000 img/s | 800 img/s |",
      "| resnet50 | cifar10, 224 px, batch 256 | fp32 | 1, single | channels-last | 1250 img/s | 800 img/s |",
      "| resnet50 | cifar10, 224 px, batch 128 | amp-bf16 | 1, single | channels-last | 4400 img/s | 3520 img/s |",
      "| resnet50 | cifar10, 224 px, batch 256 | amp-bf16 | 1, single | channels-last | 5500 img/s | 3520 img/s |"};
  size_t previous = 0;
  for (const auto& row : expected) {
    const size_t at = md.find(row);
    ASSERT_NE(at, std::string::npos) << row << "\n" << md;
    EXPECT_GT(at, previous) << "out of order: " << row << "\n" << md;
    previous = at;
  }
  EXPECT_NE(md.find("| 5500 img/s | 3520 img/s | n/a | 1.56x |"), std::string::npos) << md;
  // The runs' table says the batch of each run too.
  EXPECT_NE(md.find("| ptrain/amp-bf16-b256 | ptrain | single | amp-bf16 | 1 | 256 |"), std::string::npos) << md;

  const auto rows = parse_csv(read_text(written.side_by_side_csv_path));
  ASSERT_EQ(rows.size(), 5u);
  std::vector<std::string> order;
  for (size_t r = 1; r < rows.size(); ++r) {
    const auto row = csv_row(rows, r);
    order.push_back(row.at("precision") + "/" + row.at("batch_size_per_device"));
  }
  EXPECT_EQ(order, (std::vector<std::string>{"fp32/128", "fp32/256", "amp-bf16/128", "amp-bf16/256"}));
  const auto b256 = csv_row(rows, 4);
  EXPECT_EQ(b256.at("ptrain_per_second"), "5500");
  EXPECT_EQ(b256.at("ptrain_run"), "ptrain/amp-bf16-b256");
  EXPECT_EQ(b256.at("pytorch_eager_run"), "pytorch/amp-bf16-b256");
  EXPECT_DOUBLE_EQ(std::stod(b256.at("ptrain_vs_pytorch_eager")), 5500.0 / 3520.0);
}

// ptrain's fp8 in its own recipe (delayed scaling, the head in FP8) is not PyTorch's fp8: the reference's run
// stands beside ptrain's run of the same recipe (dynamic scaling, bf16 head), and the other recipe, with nothing
// of PyTorch's to match, has no row.
TEST(BenchReport, SideBySideMatchesFp8RunsOfTheSameRecipeOnly) {
  ScratchDir scratch;
  const fs::path runs = scratch.path() / "runs";
  RunRecord plain = speed_record("ptrain", "gpt-small", "fp8", 500, 10);
  plain.extra["fp8_layers"] = {{"fp8", 48}, {"kept_in_bf16", 1}, {"scaling", "dynamic"}};
  write_json(runs / "ptrain" / "fp8-single.json", metrics::to_json(plain));
  RunRecord delayed = speed_record("ptrain", "gpt-small", "fp8", 530, 11);
  delayed.extra["fp8_layers"] = {{"fp8", 49}, {"kept_in_bf16", 0}, {"scaling", "delayed (amax history of 16)"}};
  // Named as the bench names it: before the plain run in the report's order.
  write_json(runs / "ptrain" / "fp8-delayed-head-single.json", metrics::to_json(delayed));
  // The head in FP8 while another layer stays in bf16: the record's head_in_fp8 tells it, not the count kept.
  RunRecord head_only = speed_record("ptrain", "gpt-small", "fp8", 520, 12);
  head_only.extra["fp8_layers"] = {{"fp8", 48}, {"kept_in_bf16", 1}, {"head_in_fp8", true}, {"scaling", "dynamic"}};
  write_json(runs / "ptrain" / "fp8-head-single.json", metrics::to_json(head_only));
  RunRecord compiled = speed_record("pytorch", "gpt-small", "fp8", 400, 16);
  compiled.compiled = true;
  compiled.extra["fp8_layers"] = {{"fp8", 48}, {"kept_in_bf16", 1}, {"scaling", "dynamic"}};
  write_json(runs / "pytorch-compiled" / "fp8.json", metrics::to_json(compiled));
  RunRecord older = compiled;  // a reference record from before it named its scaling: dynamic all the same
  older.extra["fp8_layers"] = {{"fp8", 48}};
  older.steady_images_per_second = 390;
  older.steady_tokens_per_second = 390.0 * 1024;
  write_json(runs / "pytorch" / "fp8.json", [&] {
    older.compiled = false;
    return metrics::to_json(older);
  }());
  const auto written = report::write_report({runs.string()}, (scratch.path() / "out").string(), "fp8");
  const auto rows = parse_csv(read_text(written.side_by_side_csv_path));
  ASSERT_EQ(rows.size(), 2u) << written.markdown;
  const auto row = csv_row(rows, 1);
  EXPECT_EQ(row.at("precision"), "fp8");
  EXPECT_EQ(row.at("ptrain_run"), "ptrain/fp8-single");
  EXPECT_EQ(row.at("pytorch_eager_run"), "pytorch/fp8");
  EXPECT_DOUBLE_EQ(std::stod(row.at("ptrain_vs_pytorch_eager")), 500.0 / 390.0);
  EXPECT_NE(written.markdown.find("| 512000 tokens/s | 399360 tokens/s | 409600 tokens/s |"), std::string::npos)
      << written.markdown;
}

// A ptrain run with fusions left out (--skip-fusions, the fusions suite's) measures those fusions: ptrain beside
// PyTorch is the run with all of them, whatever the records' order.
TEST(BenchReport, SideBySideTakesPtrainsRunWithEveryFusion) {
  ScratchDir scratch;
  const fs::path runs = scratch.path() / "runs";
  RunRecord skipped = speed_record("ptrain", "resnet50", "amp-bf16", 6000, 7);
  skipped.kernels["skipped_fusions"] = "weight-casts";
  write_json(runs / "ptrain" / "resnet50" / "amp-bf16-a-no-weight-casts.json", metrics::to_json(skipped));
  write_json(runs / "ptrain" / "resnet50" / "amp-bf16-b.json",
             metrics::to_json(speed_record("ptrain", "resnet50", "amp-bf16", 6600, 7)));
  RunRecord compiled = speed_record("pytorch", "resnet50", "amp-bf16", 6000, 9);
  compiled.compiled = true;
  write_json(runs / "pytorch-compiled" / "resnet50" / "amp-bf16.json", metrics::to_json(compiled));
  const auto written = report::write_report({runs.string()}, (scratch.path() / "out").string(), "fusions");
  const auto rows = parse_csv(read_text(written.side_by_side_csv_path));
  ASSERT_EQ(rows.size(), 2u) << written.markdown;
  EXPECT_EQ(csv_row(rows, 1).at("ptrain_run"), "ptrain/resnet50/amp-bf16-b");
}

// PyTorch's reference trains on past a non-finite loss and records the step: its throughput and accuracy
// must not read as results anywhere the report shows them.
TEST(BenchReport, ADivergedRunIsMarkedWhereverItsAccuracyOrThroughputIsShown) {
  ScratchDir scratch;
  const fs::path runs = scratch.path() / "runs";
  RunRecord ptrain = speed_record("ptrain", "gpt-small", "fp16", 20, 9);
  ptrain.final_test_accuracy = 0.25;
  write_json(runs / "ptrain" / "gpt-small" / "fp16.json", metrics::to_json(ptrain));
  RunRecord eager = speed_record("pytorch", "gpt-small", "fp16", 16, 8);
  eager.final_test_accuracy = 0.0012;
  eager.diverged_at_step = 2;
  write_json(runs / "pytorch" / "gpt-small" / "fp16.json", metrics::to_json(eager));
  RunRecord compiled = speed_record("pytorch", "gpt-small", "fp16", 40, 8);
  compiled.compiled = true;
  compiled.diverged_at_step = 5;
  write_json(runs / "pytorch-compiled" / "gpt-small" / "fp16.json", metrics::to_json(compiled));
  const auto written = report::write_report({runs.string()}, (scratch.path() / "out").string(), "fp16");
  const std::string& md = written.markdown;

  std::string eager_row, ptrain_row;
  std::istringstream lines(md);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("| pytorch/gpt-small/fp16 |", 0) == 0) eager_row = line;
    if (line.rfind("| ptrain/gpt-small/fp16 |", 0) == 0) ptrain_row = line;
  }
  EXPECT_NE(eager_row.find("| diverged at step 2 |"), std::string::npos) << md;
  EXPECT_EQ(eager_row.find("0.12%"), std::string::npos) << "a diverged run's accuracy shown as a result: " << eager_row;
  EXPECT_NE(ptrain_row.find("| 25.00% |"), std::string::npos) << md;
  EXPECT_EQ(ptrain_row.find("diverged"), std::string::npos) << ptrain_row;
  EXPECT_NE(md.find("Diverged: pytorch/gpt-small/fp16 diverged at step 2; pytorch-compiled/gpt-small/fp16 diverged at "
                    "step 5. From that step on"),
            std::string::npos)
      << md;
  EXPECT_TRUE(has_line(md, "| gpt-small | synthetic-tokens, 1024 tokens, batch 16 | fp16 | 1, single | - | "
                           "20480 tokens/s | 16384 tokens/s (diverged at step 2) | 40960 tokens/s (diverged at step 5) | "
                           "1.25x | 0.50x | 9.00 GiB | 8.00 GiB | 8.00 GiB | 11.00 GiB | 10.00 GiB | 10.00 GiB |"))
      << md;

  const auto csv = parse_csv(read_text(written.csv_path));
  std::map<std::string, std::map<std::string, std::string>> by_run;
  for (size_t r = 1; r < csv.size(); ++r) by_run[csv[r][0]] = csv_row(csv, r);
  EXPECT_EQ(by_run.at("pytorch/gpt-small/fp16").at("diverged_at_step"), "2");
  EXPECT_DOUBLE_EQ(std::stod(by_run.at("pytorch/gpt-small/fp16").at("final_test_accuracy")), 0.0012)
      << "the CSV keeps the number beside the flag";
  EXPECT_EQ(by_run.at("ptrain/gpt-small/fp16").at("diverged_at_step"), "");

  const auto side = parse_csv(read_text(written.side_by_side_csv_path));
  ASSERT_EQ(side.size(), 2u);
  const auto row = csv_row(side, 1);
  EXPECT_EQ(row.at("ptrain_diverged_at_step"), "");
  EXPECT_EQ(row.at("pytorch_eager_diverged_at_step"), "2");
  EXPECT_EQ(row.at("pytorch_compiled_diverged_at_step"), "5");

  const std::string html = read_text(written.html_path);
  EXPECT_NE(html.find("<td class=\"number\">diverged at step 2</td>"), std::string::npos);
  EXPECT_NE(html.find("16384 tokens/s (diverged at step 2)"), std::string::npos);
}

TEST(BenchReport, WithoutPytorchRunsThereIsNoSideBySideAndAnOldFileGoes) {
  ScratchDir scratch;
  write_json(scratch.path() / "runs" / "fp32.json", metrics::to_json(fp32_baseline()));
  const fs::path out = scratch.path() / "out";
  fs::create_directories(out);
  std::ofstream(out / "side-by-side.csv") << "left from another report\n";
  const auto written = report::write_report({(scratch.path() / "runs").string()}, out.string(), "alone");
  EXPECT_EQ(written.markdown.find("beside PyTorch"), std::string::npos) << written.markdown;
  EXPECT_TRUE(written.side_by_side_csv_path.empty());
  EXPECT_FALSE(fs::exists(out / "side-by-side.csv"));
}

// The charts must not only be written but laid out by a browser: each mark a non-empty box.
TEST(BenchReport, HeadlessBrowserRendersEveryMarkOfEveryChart) {
  const fs::path browser = find_headless_browser();
  ASSERT_FALSE(browser.empty())
      << "chromium-headless-shell not found (PATH, /usr/lib/chromium, or $PTRAIN_HEADLESS_BROWSER): run "
         "scripts/setup-debian.sh, which installs Debian's chromium-headless-shell (CI runs it too)";
  ScratchDir scratch;
  const report::WrittenReport written = write_three_run_report(scratch.path());
  const fs::path errors = scratch.path() / "browser-stderr.txt";
  const std::string command = "timeout 120 '" + browser.string() +
                              "' --no-sandbox --disable-gpu --virtual-time-budget=5000 --dump-dom 'file://" +
                              fs::absolute(written.html_path).string() + "' 2>'" + errors.string() + "'";
  const auto browser_run = ptrain::testing::run_command(command, ptrain::testing::Stderr::Kept);
  ASSERT_EQ(browser_run.exit_code, 0) << command << "\n" << read_text(errors);
  const std::string& dom = browser_run.output;

  EXPECT_TRUE(std::regex_search(dom, std::regex(R"(<body\b[^>]*\bdata-charts-checked="1")")))
      << "the page's script did not run\n" << dom.substr(0, 2000);
  const auto charts = charts_of(dom);
  ASSERT_EQ(charts.size(), kExpectedMarks.size()) << dom.substr(0, 2000);
  for (const auto& [name, expected] : kExpectedMarks) {
    ASSERT_EQ(charts.count(name), 1u) << "no chart " << name;
    const auto& attributes = charts.at(name).attributes;
    ASSERT_EQ(attributes.count("data-rendered-marks"), 1u) << name;
    EXPECT_EQ(charts.at(name).marks, expected) << name;
    EXPECT_EQ(attributes.at("data-rendered-marks"), std::to_string(expected)) << name;
  }
}

// The runs' table has 18 columns: at 1,400 pixels it scrolls sideways. Throughput and accuracy come right after
// the run's description, in view before any scrolling, and the run's name stays in view while it scrolls.
TEST(BenchReport, AtFourteenHundredPixelsThroughputAndAccuracyShowAndTheRunColumnStaysWhileTheTableScrolls) {
  const fs::path browser = find_headless_browser();
  ASSERT_FALSE(browser.empty()) << "chromium-headless-shell not found: run scripts/setup-debian.sh";
  ScratchDir scratch;
  const report::WrittenReport written = write_three_run_report(scratch.path());
  std::string html = read_text(written.html_path);
  html.insert(html.rfind("</body>"), kTableLayoutProbe);
  const fs::path probed = scratch.path() / "probed.html";
  std::ofstream(probed) << html;

  auto m = body_measures(rendered_dom(browser, probed, 1400, scratch.path() / "browser-stderr.txt"));
  ASSERT_EQ(m.count("first-on-top"), 1u) << "the probe did not run";
  EXPECT_EQ(m["viewport"], 1400);
  ASSERT_GT(m["overflow"], 0) << "the table fits at 1,400 px: nothing here scrolls";
  EXPECT_LE(m["throughput-hidden"], 0) << "pixels of the throughput column beyond the visible table";
  EXPECT_LE(m["accuracy-hidden"], 0) << "pixels of the accuracy column beyond the visible table";
  EXPECT_GT(m["scrolled"], 0);
  EXPECT_LT(m["second-left"], 0) << "the second column scrolled out of view";
  EXPECT_NEAR(m["first-left"], 0, 1) << "the run's cell scrolled away with the table";
  EXPECT_NEAR(m["first-head-left"], 0, 1) << "the run's heading scrolled away with the table";
  EXPECT_EQ(m["first-on-top"], 1) << "the columns scrolling under the run's cell are drawn over it";
  EXPECT_GT(m["first-width"], 40);
}

// Memory on a CPU is the host's: no column, note or chart of a report with a CPU run says "per GPU" of it.
TEST(BenchReport, MemoryIsPerDeviceUnlessEveryRunTrainedOnCuda) {
  ScratchDir scratch;
  const fs::path cpu_runs = scratch.path() / "cpu";
  write_json(cpu_runs / "fp32.json", metrics::to_json(cpu_record("fp32")));
  write_json(cpu_runs / "bf16.json", metrics::to_json(cpu_record("amp-bf16")));
  const auto cpu = report::write_report({cpu_runs.string()}, (scratch.path() / "cpu-report").string(), "cpu");
  EXPECT_NE(cpu.markdown.find("| peak allocated/device | memory saved vs baseline | predicted peak/device |"),
            std::string::npos)
      << cpu.markdown;
  EXPECT_NE(cpu.markdown.find("allocator-allocated bytes per device over the baseline's"), std::string::npos);
  const std::string cpu_html = read_text(cpu.html_path);
  EXPECT_NE(cpu_html.find("<th>peak allocated/device</th>"), std::string::npos);
  EXPECT_NE(cpu_html.find("<figcaption>Peak memory per device</figcaption>"), std::string::npos);
  for (const std::string& text : {cpu.markdown, cpu_html}) {
    EXPECT_EQ(text.find("allocated/GPU"), std::string::npos);
    EXPECT_EQ(text.find("per GPU"), std::string::npos);
  }
  // The CSV's names are its readers' keys and stay as they were.
  EXPECT_EQ(parse_csv(read_text(cpu.csv_path))[0][10], "peak_allocated_bytes_per_gpu");

  // One CUDA run beside the CPU ones: still per device. Every run on CUDA: per GPU.
  write_json(cpu_runs / "cuda.json", metrics::to_json(ptrain_bf16()));
  const auto mixed = report::write_report({cpu_runs.string()}, (scratch.path() / "mixed-report").string(), "mixed");
  EXPECT_NE(mixed.markdown.find("| peak allocated/device |"), std::string::npos) << mixed.markdown;
  const auto cuda = write_three_run_report(scratch.path() / "cuda");
  EXPECT_NE(cuda.markdown.find("| peak allocated/GPU |"), std::string::npos) << cuda.markdown;
  EXPECT_NE(read_text(cuda.html_path).find("<figcaption>Peak GPU memory per GPU</figcaption>"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------------
// Trustworthy figures (ptrain bench --repeat): the statistics, and the rules that call a cell noisy.

TEST(BenchNoise, QuantilesAreLinearBetweenRanksAsNumpysAndTheRecordKeepsThem) {
  EXPECT_EQ(metrics::quantile({}, 0.5), std::nullopt);
  EXPECT_DOUBLE_EQ(*metrics::quantile({7.0}, 0.9), 7.0);
  // Out of order on purpose: the quantile sorts. numpy.quantile([1..10], .1/.5/.9) = 1.9, 5.5, 9.1.
  const std::vector<double> ten{10, 3, 1, 2, 9, 4, 8, 5, 7, 6};
  EXPECT_DOUBLE_EQ(*metrics::quantile(ten, 0.5), 5.5);
  EXPECT_DOUBLE_EQ(*metrics::quantile(ten, 0.1), 1.9);
  EXPECT_DOUBLE_EQ(*metrics::quantile(ten, 0.9), 9.1);
  EXPECT_DOUBLE_EQ(*metrics::quantile({1, 2, 100}, 0.5), 2.0) << "a median, not a mean";

  RunRecord r = fp32_baseline();
  metrics::set_steady_steps(r, ten, "step");
  EXPECT_DOUBLE_EQ(*r.steady_step_median_seconds, 5.5);
  EXPECT_DOUBLE_EQ(*r.steady_step_p10_seconds, 1.9);
  EXPECT_DOUBLE_EQ(*r.steady_step_p90_seconds, 9.1);
  const RunRecord read = metrics::run_record_from_json(metrics::to_json(r));
  EXPECT_EQ(read.steady_step_seconds, ten);
  EXPECT_EQ(read.steady_step_timing, "step");
  EXPECT_DOUBLE_EQ(*read.steady_step_p90_seconds, 9.1);
  metrics::set_steady_steps(r, {}, "step");
  EXPECT_EQ(r.steady_step_median_seconds, std::nullopt);
  EXPECT_EQ(r.steady_step_timing, "") << "no steps, no timing";
}

TEST(BenchNoise, SpreadRangeAndStallRules) {
  EXPECT_EQ(report::relative_range({100.0}), std::nullopt) << "one round has no range";
  EXPECT_DOUBLE_EQ(*report::relative_range({100, 104, 98}), 6.0 / 100);
  RunRecord quiet = fp32_baseline();
  metrics::set_steady_steps(quiet, {1.00, 1.01, 0.99, 1.00, 1.02, 0.98, 1.00, 1.01, 0.99, 1.00}, "step");
  EXPECT_LT(*report::step_spread(quiet), report::kNoisySpread);
  EXPECT_EQ(report::stall(quiet), std::nullopt);
  RunRecord stalled = quiet;
  stalled.steady_step_seconds.push_back(4.0);  // the statistics of the nine before: one step over 3x the median
  metrics::set_steady_steps(stalled, stalled.steady_step_seconds, "step");
  ASSERT_TRUE(report::stall(stalled).has_value());
  EXPECT_DOUBLE_EQ(*report::stall(stalled), 4.0);
  EXPECT_EQ(report::step_spread(fp32_baseline()), std::nullopt) << "a record without step times";
}

namespace {

// A ptrain or PyTorch round of one cell: its steady throughput, its steps (spread as given) and the bench's context.
RunRecord round_record(const std::string& framework, double steady, int64_t repeat, double step_wobble,
                       double load_before, double load_after) {
  RunRecord r = speed_record(framework, "resnet50", "amp-bf16", steady, 5);
  r.channels_last = true;
  if (framework == "pytorch") r.compiled = false;
  const double step = 128.0 / steady;
  std::vector<double> steps;
  for (int i = 0; i < 20; ++i) steps.push_back(step * (1.0 + step_wobble * ((i % 5) - 2) / 2.0));
  metrics::set_steady_steps(r, steps, "step");
  r.extra["bench"] = {{"repeat", repeat},
                      {"load_average_before", {load_before, 0.5, 0.5}},
                      {"load_average_after", {load_after, 0.5, 0.5}},
                      {"cores", 2}};
  return r;
}

report::Report rounds_report(const std::vector<std::pair<double, double>>& pairs, double wobble = 0.0,
                             double load = 0.2) {
  std::vector<report::ReportRun> runs;
  for (size_t k = 0; k < pairs.size(); ++k) {
    const std::string suffix = k ? ".repeat-" + std::to_string(k + 1) : "";
    runs.push_back({"ptrain/amp-bf16" + suffix, "", round_record("ptrain", pairs[k].first, k + 1, wobble, load, load), {}});
    runs.push_back({"pytorch/amp-bf16" + suffix, "", round_record("pytorch", pairs[k].second, k + 1, 0.0, load, load), {}});
  }
  return report::make_report(std::move(runs), "rounds");
}

}  // namespace

TEST(BenchNoise, ACellGivesTheMedianRatioWithItsRangeAndQuietRoundsAreNotNoisy) {
  const report::Report quiet = rounds_report({{4400, 4000}, {4440, 4000}, {4420, 4010}});
  const auto rows = report::side_by_side(quiet);
  ASSERT_EQ(rows.size(), 1u);
  ASSERT_EQ(rows[0].ptrain_rounds.size(), 3u);
  ASSERT_EQ(rows[0].eager_rounds.size(), 3u);
  const auto summary = report::ratio_summary(quiet, rows[0].ptrain_rounds, rows[0].eager_rounds);
  EXPECT_EQ(summary.pairs, 3u);
  EXPECT_NEAR(*summary.median, 4420.0 / 4010.0, 1e-12) << "the pairs' ratios 1.1, 1.11, 1.1022: the middle one";
  EXPECT_NEAR(*summary.min, 1.1, 1e-12);
  EXPECT_NEAR(*summary.max, 1.11, 1e-12);
  EXPECT_TRUE(summary.noisy.empty()) << summary.noisy.front();
  const std::string md = report::render_markdown(quiet);
  EXPECT_NE(md.find("| 4420 img/s | 4000 img/s | n/a | 1.10x (1.10-1.11x, 3 pairs) |"), std::string::npos) << md;
  EXPECT_EQ(md.find(" noisy |"), std::string::npos) << md;
  EXPECT_EQ(md.find("Noisy: "), std::string::npos) << md;
  EXPECT_NE(md.find("Machine load during the bench: load average (1 min) 0.2 to 0.2 around the 6 runs, on 2 cores."),
            std::string::npos)
      << md;
}

TEST(BenchNoise, ACellWhoseRoundsSpreadMoreThanFivePercentIsNoisyAndSaysWhy) {
  // ptrain's rounds vary 20%; the ratio's range 0.95-1.15x crosses 1.0; the load was high.
  const report::Report busy = rounds_report({{3800, 4000}, {4600, 4000}, {4400, 4000}}, 0.0, 3.5);
  const auto rows = report::side_by_side(busy);
  ASSERT_EQ(rows.size(), 1u);
  const auto summary = report::ratio_summary(busy, rows[0].ptrain_rounds, rows[0].eager_rounds);
  EXPECT_DOUBLE_EQ(*summary.median, 1.1);
  EXPECT_DOUBLE_EQ(*summary.min, 0.95);
  EXPECT_DOUBLE_EQ(*summary.max, 1.15);
  const std::vector<std::string> why{"the ratio's range 0.95-1.15x crosses 1.0",
                                     "ptrain's throughput varies 18% over its 3 rounds",
                                     "load average 3.5 to 3.5 around its runs on 2 cores"};
  EXPECT_EQ(summary.noisy, why);
  const std::string md = report::render_markdown(busy);
  EXPECT_NE(md.find("| 1.10x (0.95-1.15x, 3 pairs) noisy |"), std::string::npos) << md;
  EXPECT_NE(md.find("Noisy: resnet50 amp-bf16, 1 single, batch 128, ptrain / eager: the ratio's range 0.95-1.15x "
                    "crosses 1.0; ptrain's throughput varies 18% over its 3 rounds; load average 3.5 to 3.5 around "
                    "its runs on 2 cores."),
            std::string::npos)
      << md;
  const auto csv = parse_csv(report::render_side_by_side_csv(busy));
  const auto row = csv_row(csv, 1);
  EXPECT_DOUBLE_EQ(std::stod(row.at("ptrain_vs_pytorch_eager")), 1.1) << "the median";
  EXPECT_DOUBLE_EQ(std::stod(row.at("ptrain_vs_pytorch_eager_min")), 0.95);
  EXPECT_DOUBLE_EQ(std::stod(row.at("ptrain_vs_pytorch_eager_max")), 1.15);
  EXPECT_EQ(row.at("ptrain_vs_pytorch_eager_pairs"), "3");
  EXPECT_EQ(row.at("ptrain_vs_pytorch_eager_noisy").rfind("the ratio's range", 0), 0u);
  EXPECT_EQ(row.at("ptrain_per_second"), "4400") << "the rounds' median";
}

TEST(BenchNoise, ARunWhoseStepsSpreadOrStallMakesItsCellNoisyEvenInOneRound) {
  // Steps from 0.8 to 1.2 of the median: (p90 - p10) / median = 40%.
  const report::Report wobbly = rounds_report({{4400, 4000}}, 0.2);
  const auto rows = report::side_by_side(wobbly);
  ASSERT_EQ(rows.size(), 1u);
  const auto summary = report::ratio_summary(wobbly, rows[0].ptrain_rounds, rows[0].eager_rounds);
  ASSERT_EQ(summary.pairs, 1u);
  ASSERT_FALSE(summary.noisy.empty());
  EXPECT_EQ(summary.noisy.front(), "ptrain/amp-bf16's steady steps spread 40% (p10 to p90 over the median)");
  EXPECT_NE(report::render_markdown(wobbly).find("| 1.10x noisy |"), std::string::npos);

  std::vector<report::ReportRun> runs;
  RunRecord stalled = round_record("ptrain", 4400, 1, 0.0, 0.1, 0.1);
  stalled.steady_step_seconds.back() *= 5;
  metrics::set_steady_steps(stalled, stalled.steady_step_seconds, "step");
  runs.push_back({"ptrain/amp-bf16", "", stalled, {}});
  runs.push_back({"pytorch/amp-bf16", "", round_record("pytorch", 4000, 1, 0.0, 0.1, 0.1), {}});
  const report::Report report = report::make_report(std::move(runs), "stall");
  const auto row = report::side_by_side(report).at(0);
  const auto stall = report::ratio_summary(report, row.ptrain_rounds, row.eager_rounds);
  EXPECT_EQ(stall.noisy, (std::vector<std::string>{"ptrain/amp-bf16 stalled: a step took 5.0x its median",
                                                   "load average 0.1 to 0.1 around its runs on 2 cores"}));
}
