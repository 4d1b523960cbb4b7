// The benchmark report: every run record of some directories side by side, as report.md (for people and
// stdout), report.csv (for scripts) and report.html (one self-contained file with the table and charts that
// opens offline). ptrain runs and PyTorch reference runs (bench/pytorch_reference.py) share the record
// format, so one report compares the two.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ptrain/report/report_curves.h"
#include "ptrain/metrics/run_record.h"

namespace ptrain::report {

struct ReportRun {
  std::string name;    // the record's path below its run directory, without ".json": the user's name for the run
  std::string source;  // the file it came from, for messages
  metrics::RunRecord record;
  std::vector<LoggedStep> logged_steps;  // from the --log-jsonl file beside the record, if there is one
};

struct Report {
  std::string title;
  std::vector<ReportRun> runs;
  // Per run, the run its speed-up and memory saving are measured against: the baseline of its job (the same
  // model on the same data at the same input size, job_of()): the job's first ptrain single-device fp32 run,
  // or where it has none its first ptrain run (or, without one, its first run), which every rendering names.
  std::vector<size_t> baseline_of;
  bool is_baseline(size_t run) const { return baseline_of.at(run) == run; }
  // JSON files of the run directories that are not run records (a bench's bench.json, an estimate's output), each
  // "path (why)": left out, and listed where the report ends.
  std::vector<std::string> skipped;
  // What the report's reader must know before its figures, each a paragraph under the title (a bench's quick
  // suite: "Accuracy is left out: ...", the warm-up paid before the clocks started).
  std::vector<std::string> notes;
};

// "resnet50 on cifar10 at 224 px", "gpt-small on synthetic-tokens at 1024 tokens": runs of one job compare
// with each other; runs of different jobs only through the side-by-side table.
std::string job_of(const metrics::RunRecord& r);
// Whether a run is what a job's baseline should be: ptrain, single device, fp32.
bool is_single_device_fp32_ptrain(const metrics::RunRecord& r);

// Reads every *.json below each directory (recursively, in path order, so that reports are stable). A file whose
// JSON is not an object with a run record's "schema_version" and "epochs_detail" is another tool's (bench.json,
// an estimate's): left out, and named with why in skipped (when given). Throws ptrain::Error naming the directory
// when it is missing or holds no run record (naming the files left out), and naming the file and the key when a
// file is not valid JSON or is a run record that does not read as one.
std::vector<ReportRun> read_runs(const std::vector<std::string>& run_dirs, std::vector<std::string>* skipped = nullptr);

// Orders the runs by job, devices, strategy (single, dp, ddp, zero1..3, fsdp) and precision (fp32 to amp-bf16),
// ptrain before PyTorch, and picks each job's baseline (Report::baseline_of).
Report make_report(std::vector<ReportRun> runs, std::string title);

// Training throughput over its job's baseline's; nullopt when either is missing or the baseline's is zero.
std::optional<double> speedup_vs_baseline(const Report& report, size_t run);
// 1 - peak allocated bytes per GPU / its job's baseline's (negative: more memory than the baseline); nullopt
// when either is missing. Allocator bytes rather than NVML's: NVML counts the CUDA context and other
// processes too, which are not the training's doing.
std::optional<double> memory_saved_vs_baseline(const Report& report, size_t run);

// torch.compile's mode of a PyTorch record (extra.compile.mode); "default" where the record names none.
std::string compile_mode_of(const metrics::RunRecord& r);

// The torch.compile modes of the side-by-side table's compiled columns, a column each: the modes of the
// report's compiled records, the mode with the most records first (then in compile_modes order: default,
// reduce-overhead, max-autotune, ...); {""} where the report has no compiled record (one column, n/a).
std::vector<std::string> side_by_side_compile_modes(const Report& report);

// ptrain beside PyTorch: one row per job (model, data, strategy, devices), precision mode and batch, holding
// ptrain's run, PyTorch eager's in the same memory format, and PyTorch compiled's (torch.compile, in
// whatever format it ran) in each compile mode. Rows only for jobs with a PyTorch run, ordered by model,
// data, mode and batch (the rows of a batch-size sweep one under the other).
struct SideBySideRow {
  std::string model, dataset, precision, strategy;  // precision without a "+channels-last" suffix
  int64_t devices = 1, batch_size_per_device = 0, image_size = 0;
  std::optional<int64_t> seq_len;      // language models
  std::optional<bool> channels_last;   // the memory format of the ptrain and eager runs; none for language models
  std::optional<size_t> ptrain, eager;  // indices into Report::runs
  // PyTorch compiled's run per side_by_side_compile_modes(report), in that order.
  std::vector<std::optional<size_t>> compiled;
  // Every round of each (`ptrain bench --repeat`), in round order; ptrain, eager and compiled above are the first.
  std::vector<size_t> ptrain_rounds, eager_rounds;
  std::vector<std::vector<size_t>> compiled_rounds;
};
std::vector<SideBySideRow> side_by_side(const Report& report);

// Throughput of run a over run b: steady over steady where both have it, else over the whole training;
// nullopt when either is missing.
std::optional<double> throughput_ratio(const Report& report, size_t a, size_t b);

// How far one bench figure can be trusted. A cell of the side-by-side table is ptrain's rounds over another
// column's, paired by round (extra.bench.repeat, else their order): the median ratio, its range over the pairs,
// and why it is noisy, if it is. Noisy: the range crosses 1.0 (the rounds disagree on which is faster); either
// side's throughput varies more than kNoisySpread over its rounds ((max - min) / median); a run's steady steps
// spread more than kNoisySpread ((p90 - p10) / median); or a run stalled (a step over kStallFactor x its median).
// The reasons end with the load average the cell's runs saw, where the bench recorded it.
inline constexpr double kNoisySpread = 0.05;
inline constexpr double kStallFactor = 3.0;
struct RatioSummary {
  std::optional<double> median, min, max;
  size_t pairs = 0;
  std::vector<std::string> noisy;  // why; empty for a quiet cell
};
RatioSummary ratio_summary(const Report& report, const std::vector<size_t>& ptrain, const std::vector<size_t>& other);
// (max - min) / median of values (throughputs of a cell's rounds); nullopt for fewer than two.
std::optional<double> relative_range(std::vector<double> values);
// (p90 - p10) / median of a run's steady steps; nullopt where the record has none.
std::optional<double> step_spread(const metrics::RunRecord& r);
// The slowest steady step over the median, where it exceeds kStallFactor; nullopt otherwise.
std::optional<double> stall(const metrics::RunRecord& r);
// The median of values; nullopt for none.
std::optional<double> median_of(const std::vector<double>& values);
// What the bench saw of the machine's load: "load average (1 min) 0.4 to 2.9 around the 12 runs, on 2 cores";
// empty where no record carries extra.bench.
std::string machine_load_text(const Report& report);

std::string render_markdown(const Report& report);
std::string render_csv(const Report& report);
// The side-by-side rows as CSV (one line a row); empty when there are none.
std::string render_side_by_side_csv(const Report& report);
std::string render_html(const Report& report);

// Escapes & < > " ' for text and attribute values of HTML and inline SVG.
std::string escape_html(std::string_view text);

struct WrittenReport {
  std::string markdown_path, csv_path, html_path;
  std::string side_by_side_csv_path;  // side-by-side.csv; empty when no run had a PyTorch counterpart
  std::string markdown;  // what report.md holds, for printing
  std::vector<std::string> skipped;  // Report::skipped
};

// read_runs, make_report and the renderings into out_dir (created when missing): report.md, report.csv,
// report.html, and side-by-side.csv where there are side-by-side rows. Each file is written beside its
// final name and renamed over it: a browser or script never reads half a report. notes: Report::notes.
WrittenReport write_report(const std::vector<std::string>& run_dirs, const std::string& out_dir,
                           const std::string& title, std::vector<std::string> notes = {});

}  // namespace ptrain::report
