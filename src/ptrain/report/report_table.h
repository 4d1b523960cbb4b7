// The report's table model, shared by its renderings (report_text.cpp: Markdown and CSV; report_html.cpp:
// HTML with charts) so that they cannot disagree: the values a record holds and how each is written (number
// formats), the columns of the runs' table, the sentences under it, and the side-by-side table's cells.
// Internal to report/ (and the bench's one-line summary of a run).
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ptrain/report/report.h"

namespace ptrain::report::table {

inline constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
inline constexpr char kNotAvailable[] = "n/a";

// Values: a record keeps unmeasured numbers as nullopt or NaN (a JSON null read into a required double);
// the report treats both as missing.
std::optional<double> measured(double value);
std::optional<double> measured(std::optional<double> value);
std::optional<double> measured(std::optional<int64_t> value);

// Number formats.
std::string printf_string(const char* format, double value);
std::string shortest_number(double value);  // the shortest text that reads back as value
std::string gib_text(std::optional<double> bytes);
std::string duration_text(std::optional<double> seconds);
std::string percent_text(std::optional<double> percent, const char* format = "%.0f%%");
std::string fraction_as_percent_text(std::optional<double> fraction);
std::string throughput_text(std::optional<double> images_per_second);
std::string csv_number(std::optional<double> value);  // empty when missing

std::string framework_display_name(const std::string& framework);
const metrics::RunRecord& record_of(const Report& report, size_t run);
// "ptrain, ddp, fp32, 2 devices, batch 128/device"
std::string run_descriptor(const metrics::RunRecord& r);
bool is_language_model_run(const metrics::RunRecord& r);

// What memory is measured on: "GPU" when every run trained on CUDA, else "device" (the host's memory for a
// CPU run).
std::string memory_unit(const Report& report);

// One column list for report.md, report.csv and report.html, the columns a reader compares first (throughput,
// accuracy, speed-up, memory) right after the run's description.
struct Column {
  const char* title;     // report.md and report.html
  const char* csv_name;  // report.csv: plain units in the name, as in the run record
  bool numeric;
  std::function<std::string(const Report&, size_t)> text;
  std::function<std::string(const Report&, size_t)> csv;
  bool in_tables = true;  // false: report.csv only (what the tables say inside another column's cell)
  bool per_device = false;  // a figure per device: the title says per what (column_title)
};
const std::vector<Column>& columns();        // report.csv's
const std::vector<Column>& table_columns();  // report.md's and report.html's: columns() less the CSV-only ones
// "peak allocated/GPU", or "peak allocated/device" where a run was not on CUDA.
std::string column_title(const Column& column, const Report& report);

// Sentences under the table, shared by report.md and report.html (which escape them their own way).
std::vector<std::string> table_notes(const Report& report);
// "3 runs: resnet20 on synthetic (8 px)."
std::string job_summary(const Report& report);
// A run's input size as its job is named by: "1024 tokens" for language models, "224 px" otherwise.
std::string input_size_text(const metrics::RunRecord& r);

// The side-by-side table: its heading, column titles, cells per row and the note under it.
extern const char* const kSideBySideHeading;
// The note names torch.compile's mode from the compiled records (extra.compile.mode).
std::string side_by_side_note(const Report& report);
// PyTorch compiled's throughput, ratio, peak and device columns, one of each per compile mode
// (side_by_side_compile_modes), each named with its mode: "PyTorch compiled (reduce-overhead)".
std::vector<std::string> side_by_side_titles(const Report& report);
// "compiled (reduce-overhead)"; "compiled" for a report without compiled records.
std::string compiled_column_name(const std::string& mode);
inline constexpr size_t kSideBySideTextColumns = 5;  // the columns before the numbers
std::vector<std::string> side_by_side_cells(const Report& report, const SideBySideRow& row);
// Sentences under the side-by-side table on the figures' trust: the machine's load during the bench, and each
// noisy cell with why (RatioSummary); none where no record carries step times or bench context.
std::vector<std::string> noise_notes(const Report& report);
// The median throughput of a cell's rounds (shown_throughput); nullopt where none has one.
std::optional<double> median_throughput(const Report& report, const std::vector<size_t>& rounds);
// Steady throughput where measured, else over the whole training; in tokens for language models.
std::optional<double> shown_throughput(const metrics::RunRecord& r);

// A run whose loss stopped being finite and that trained on (a PyTorch reference run, or ptrain's with
// --on-divergence warn): every rendering says so where its accuracy or throughput is shown, so that a number
// from a run that no longer learned never passes for a result. "diverged at step 5"
std::optional<std::string> divergence_text(const metrics::RunRecord& r);

}  // namespace ptrain::report::table
