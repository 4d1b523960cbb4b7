#include "ptrain/report/report.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <tuple>

#include "ptrain/report/report_table.h"
#include "ptrain/core/error.h"
#include "ptrain/core/text.h"
#include "ptrain/io/atomic_file.h"
#include "ptrain/precision/policy.h"
#include "ptrain/strategy_spec/strategy_spec.h"

namespace ptrain::report {

namespace fs = std::filesystem;
using metrics::RunRecord;
using table::is_language_model_run;
using table::measured;
using table::record_of;

// A record's strategy and precision are its names as written (a PyTorch record's too): they are compared
// with the names the strategy spec and the precision policy give their kinds, never with literals.
bool is_single_device_fp32_ptrain(const RunRecord& r) {
  return r.framework == metrics::kFrameworkPtrain && r.strategy == strategies::StrategySpec().name() &&
         r.precision == precision::to_string(precision::PrecisionMode::FP32) && r.devices == 1;
}

std::string job_of(const RunRecord& r) {
  return r.model + " on " + r.dataset + " at " + table::input_size_text(r);
}

namespace {

// Where a name stands in a list of known names; unknown ones after all of them, among themselves by name.
size_t rank_in(const std::vector<std::string>& order, const std::string& name) {
  const auto it = std::find(order.begin(), order.end(), name);
  return static_cast<size_t>(it - order.begin());
}

// Strategies in the spec's order, from one device's to the most sharded.
size_t strategy_rank(const std::string& strategy) { return rank_in(strategies::StrategySpec::names(), strategy); }

// Precisions in the policy's order, from full to least, each mode's "+master" (fp32 master weights) after it.
constexpr char kMasterSuffix[] = "+master";
size_t precision_rank(const std::string& precision) {
  std::string mode = precision;
  const bool master = remove_suffix(mode, kMasterSuffix);
  return 2 * rank_in(precision::precision_names(), mode) + (master ? 1 : 0);
}

// Rows read as the comparison goes: devices, then the strategy, then the precision from full to least,
// each ptrain run before the PyTorch run of the same mode.
bool comes_before(const ReportRun& a, const ReportRun& b) {
  const auto key = [](const ReportRun& run) {
    const auto& r = run.record;
    return std::make_tuple(r.model, r.dataset, r.devices, strategy_rank(r.strategy), r.strategy,
                           precision_rank(r.precision), r.precision, r.framework != "ptrain",
                           r.compiled.value_or(false), run.name);
  };
  return key(a) < key(b);
}

// Side by side: ptrain, PyTorch eager and PyTorch compiled per job and mode.
constexpr char kChannelsLastSuffix[] = "+channels-last";

std::string base_precision(const std::string& precision) {
  return ends_with(precision, kChannelsLastSuffix)
             ? precision.substr(0, precision.size() - std::string(kChannelsLastSuffix).size())
             : precision;
}

// Records before the channels_last field said it in the PyTorch reference's precision.
std::optional<bool> memory_format_of(const RunRecord& r) {
  if (is_language_model_run(r)) return std::nullopt;
  return r.channels_last ? *r.channels_last : ends_with(r.precision, kChannelsLastSuffix);
}

// An fp8 run's recipe beyond the mode's defaults, as its record's extra.fp8_layers tells it: "delayed scaling"
// and "FP8 head" where they ran (ptrain's --fp8-scaling delayed and --fp8-head), "" for the recipe PyTorch's
// reference also has (dynamic scaling, the head in bf16). Runs of different recipes are different rows.
std::string fp8_recipe_of(const RunRecord& r) {
  if (precision::precision_mode_or_none(base_precision(r.precision)) != precision::PrecisionMode::FP8 ||
      !r.extra.is_object()) {
    return "";
  }
  const auto layers = r.extra.find("fp8_layers");
  if (layers == r.extra.end() || !layers->is_object()) return "";
  std::string recipe;
  const auto scaling = layers->find("scaling");
  if (scaling != layers->end() && scaling->is_string() && scaling->get<std::string>().rfind("delayed", 0) == 0) {
    recipe = "delayed scaling";
  }
  // Records name the head outright; older ones only counted the layers kept in bf16, the head among them.
  const auto head = layers->find("head_in_fp8");
  const auto kept = layers->find("kept_in_bf16");
  const bool head_in_fp8 = head != layers->end() && head->is_boolean()
                               ? head->get<bool>()
                               : kept != layers->end() && kept->is_number_integer() && kept->get<int64_t>() == 0;
  if (head_in_fp8) recipe += std::string(recipe.empty() ? "" : ", ") + "FP8 head";
  return recipe;
}

}  // namespace

Report make_report(std::vector<ReportRun> runs, std::string title) {
  check(!runs.empty(), "a report needs at least one run");
  Report report;
  report.title = std::move(title);
  report.runs = std::move(runs);
  std::stable_sort(report.runs.begin(), report.runs.end(), comes_before);
  // The best candidate of each job: a single-device fp32 ptrain run, else a ptrain run, else any; the first of the
  // best kind in the table's order.
  const auto preference = [](const RunRecord& r) {
    return is_single_device_fp32_ptrain(r) ? 0 : r.framework == metrics::kFrameworkPtrain ? 1 : 2;
  };
  std::map<std::string, size_t> baseline_of_job;
  for (size_t i = 0; i < report.runs.size(); ++i) {
    const auto [it, inserted] = baseline_of_job.emplace(job_of(report.runs[i].record), i);
    if (!inserted && preference(report.runs[i].record) < preference(report.runs[it->second].record)) it->second = i;
  }
  for (const auto& run : report.runs) report.baseline_of.push_back(baseline_of_job.at(job_of(run.record)));
  return report;
}

std::optional<double> speedup_vs_baseline(const Report& report, size_t run) {
  const RunRecord& r = record_of(report, run);
  const RunRecord& b = record_of(report, report.baseline_of.at(run));
  const bool steady = measured(r.steady_images_per_second) && measured(b.steady_images_per_second);
  const auto mine = measured(steady ? *r.steady_images_per_second : r.images_per_second);
  const auto base = measured(steady ? *b.steady_images_per_second : b.images_per_second);
  if (!mine || !base || *base <= 0.0) return std::nullopt;
  return *mine / *base;
}

std::optional<double> memory_saved_vs_baseline(const Report& report, size_t run) {
  const auto mine = measured(record_of(report, run).peak_allocated_bytes);
  const auto base = measured(record_of(report, report.baseline_of.at(run)).peak_allocated_bytes);
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

std::string compile_mode_of(const RunRecord& r) {
  const auto compile = r.extra.find("compile");
  const bool named = compile != r.extra.end() && compile->is_object() && compile->contains("mode") &&
                     compile->at("mode").is_string();
  return named ? compile->at("mode").get<std::string>() : "default";
}

std::vector<std::string> side_by_side_compile_modes(const Report& report) {
  std::map<std::string, size_t> records;
  for (const auto& run : report.runs) {
    if (run.record.framework != metrics::kFrameworkPtrain && run.record.compiled.value_or(false)) {
      ++records[compile_mode_of(run.record)];
    }
  }
  if (records.empty()) return {""};
  static const std::vector<std::string> order{"default", "reduce-overhead", "max-autotune",
                                              "max-autotune-no-cudagraphs"};
  std::vector<std::string> modes;
  for (const auto& [mode, count] : records) modes.push_back(mode);
  std::stable_sort(modes.begin(), modes.end(), [&](const std::string& a, const std::string& b) {
    return std::make_tuple(records.at(b), rank_in(order, a), a) < std::make_tuple(records.at(a), rank_in(order, b), b);
  });
  return modes;
}

std::vector<SideBySideRow> side_by_side(const Report& report) {
  // Devices, strategy and precision before the batch: a batch-size sweep's rows stay together.
  using Key = std::tuple<std::string, std::string, int64_t, int64_t, int64_t, size_t, std::string, size_t,
                         std::string, int64_t>;
  const std::vector<std::string> modes = side_by_side_compile_modes(report);
  struct Group {
    SideBySideRow shape;
    std::vector<size_t> ptrain, eager;
    std::vector<std::vector<size_t>> compiled;  // per mode
  };
  std::map<Key, Group> groups;
  for (size_t i = 0; i < report.runs.size(); ++i) {
    const RunRecord& r = report.runs[i].record;
    // ptrain with fusions left out (--skip-fusions) is a measurement of those fusions, not ptrain beside PyTorch.
    if (r.framework == metrics::kFrameworkPtrain && r.kernels.contains("skipped_fusions")) continue;
    const std::string recipe = fp8_recipe_of(r);
    const std::string precision = base_precision(r.precision) + (recipe.empty() ? "" : " (" + recipe + ")");
    const Key key{r.model, r.dataset, r.image_size, r.seq_len.value_or(0), r.devices, strategy_rank(r.strategy),
                  r.strategy, precision_rank(base_precision(r.precision)), precision, r.batch_size_per_device};
    Group& group = groups[key];
    group.shape = {r.model, r.dataset, precision, r.strategy, r.devices, r.batch_size_per_device, r.image_size,
                   r.seq_len, std::nullopt, std::nullopt, std::nullopt, {}, {}, {}, {}};
    group.compiled.resize(modes.size());
    if (r.framework == metrics::kFrameworkPtrain) {
      group.ptrain.push_back(i);
    } else if (r.compiled.value_or(false)) {
      const auto mode = std::find(modes.begin(), modes.end(), compile_mode_of(r));
      group.compiled[static_cast<size_t>(mode - modes.begin())].push_back(i);
    } else {
      group.eager.push_back(i);
    }
  }
  std::vector<SideBySideRow> rows;
  for (const auto& [key, group] : groups) {
    const auto any_compiled = std::find_if(group.compiled.begin(), group.compiled.end(),
                                           [](const auto& runs) { return !runs.empty(); });
    // Nothing of PyTorch's to compare with: no row.
    if (group.eager.empty() && any_compiled == group.compiled.end()) continue;
    // One row per memory format of ptrain's and eager's runs (they compare like with like); compiled is PyTorch
    // at its best in whatever format, beside each.
    std::vector<std::optional<bool>> formats;
    for (const auto* runs : {&group.ptrain, &group.eager}) {
      for (size_t i : *runs) {
        const auto format = memory_format_of(report.runs[i].record);
        if (std::find(formats.begin(), formats.end(), format) == formats.end()) formats.push_back(format);
      }
    }
    if (formats.empty()) formats.push_back(memory_format_of(report.runs[any_compiled->front()].record));
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
      const auto all_in = [&](const std::vector<size_t>& runs) {
        std::vector<size_t> rounds;
        for (size_t i : runs) {
          if (memory_format_of(report.runs[i].record) == format) rounds.push_back(i);
        }
        return rounds;
      };
      row.ptrain = first_in(group.ptrain);
      row.eager = first_in(group.eager);
      row.ptrain_rounds = all_in(group.ptrain);
      row.eager_rounds = all_in(group.eager);
      for (const auto& runs : group.compiled) {
        row.compiled.push_back(runs.empty() ? std::nullopt : std::optional(first_in(runs).value_or(runs.front())));
        const auto rounds = all_in(runs);
        row.compiled_rounds.push_back(rounds.empty() ? runs : rounds);
      }
      rows.push_back(row);
    }
  }
  return rows;
}

WrittenReport write_report(const std::vector<std::string>& run_dirs, const std::string& out_dir,
                           const std::string& title, std::vector<std::string> notes) {
  std::vector<std::string> skipped;
  Report report = make_report(read_runs(run_dirs, &skipped), title);
  report.skipped = std::move(skipped);
  report.notes = std::move(notes);
  std::error_code error;
  fs::create_directories(out_dir, error);
  check(!error, "cannot create report directory " + out_dir + ": " + error.message());
  WrittenReport written;
  written.skipped = report.skipped;
  written.markdown = render_markdown(report);
  written.markdown_path = (fs::path(out_dir) / "report.md").string();
  written.csv_path = (fs::path(out_dir) / "report.csv").string();
  written.html_path = (fs::path(out_dir) / "report.html").string();
  io::write_file_atomically(written.markdown_path, written.markdown);
  io::write_file_atomically(written.csv_path, render_csv(report));
  io::write_file_atomically(written.html_path, render_html(report));
  const std::string side_by_side_csv = render_side_by_side_csv(report);
  const std::string side_by_side_path = (fs::path(out_dir) / "side-by-side.csv").string();
  if (!side_by_side_csv.empty()) {
    written.side_by_side_csv_path = side_by_side_path;
    io::write_file_atomically(side_by_side_path, side_by_side_csv);
  } else {
    ::unlink(side_by_side_path.c_str());  // a report of other runs in the same folder must not keep an old one
  }
  return written;
}

}  // namespace ptrain::report
