// report.md and report.csv (with side-by-side.csv): the table model (report_table.h) as Markdown and CSV,
// each escaped its own way.
#include <sstream>
#include <string_view>

#include "ptrain/report/report.h"
#include "ptrain/report/report_table.h"

namespace ptrain::report {

using namespace table;

namespace {

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

}  // namespace

std::string render_markdown(const Report& report) {
  std::ostringstream md;
  md << "# " << escape_markdown(report.title) << "\n\n" << escape_markdown(job_summary(report)) << "\n\n";
  for (const auto& note : report.notes) md << escape_markdown(note) << "\n\n";
  md << "|";
  for (const auto& column : table_columns()) md << " " << column_title(column, report) << " |";
  md << "\n|";
  for (const auto& column : table_columns()) md << (column.numeric ? " ---: |" : " --- |");
  md << "\n";
  for (size_t i = 0; i < report.runs.size(); ++i) {
    md << "|";
    for (const auto& column : table_columns()) md << " " << escape_markdown(column.text(report, i)) << " |";
    md << "\n";
  }
  md << "\n";
  for (const auto& note : table_notes(report)) md << escape_markdown(note) << "\n\n";
  const auto rows = side_by_side(report);
  if (!rows.empty()) {
    md << "## " << kSideBySideHeading << "\n\n|";
    const auto titles = side_by_side_titles(report);
    for (const auto& title : titles) md << " " << title << " |";
    md << "\n|";
    for (size_t c = 0; c < titles.size(); ++c) md << (c < kSideBySideTextColumns ? " --- |" : " ---: |");
    md << "\n";
    for (const auto& row : rows) {
      md << "|";
      for (const auto& cell : side_by_side_cells(report, row)) md << " " << escape_markdown(cell) << " |";
      md << "\n";
    }
    md << "\n" << escape_markdown(side_by_side_note(report)) << "\n\n";
  }
  for (const auto& note : noise_notes(report)) md << escape_markdown(note) << "\n\n";
  if (!report.skipped.empty()) {
    md << "## Files left out\n\n";
    for (const auto& file : report.skipped) md << "- " << escape_markdown(file) << "\n";
    md << "\n";
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

// The compiled columns of the first compile mode keep their names, with pytorch_compiled_mode saying the
// mode; each further mode adds its own after every other column: pytorch_compiled_reduce_overhead_per_second.
std::string render_side_by_side_csv(const Report& report) {
  const auto rows = side_by_side(report);
  if (rows.empty()) return "";
  const auto modes = side_by_side_compile_modes(report);
  std::ostringstream csv;
  csv << "model,dataset,image_size,seq_len,batch_size_per_device,precision,strategy,devices,channels_last,"
         "throughput_unit,ptrain_per_second,pytorch_eager_per_second,pytorch_compiled_per_second,"
         "ptrain_vs_pytorch_eager,ptrain_vs_pytorch_compiled,ptrain_peak_allocated_bytes,"
         "pytorch_eager_peak_allocated_bytes,pytorch_compiled_peak_allocated_bytes,ptrain_peak_nvml_used_bytes,"
         "pytorch_eager_peak_nvml_used_bytes,pytorch_compiled_peak_nvml_used_bytes,ptrain_run,pytorch_eager_run,"
         "pytorch_compiled_run,ptrain_diverged_at_step,pytorch_eager_diverged_at_step,"
         "pytorch_compiled_diverged_at_step,pytorch_compiled_mode";
  for (size_t m = 1; m < modes.size(); ++m) {
    std::string name = "pytorch_compiled_" + modes[m];
    for (auto& c : name) c = c == '-' ? '_' : c;
    csv << "," << name << "_per_second,ptrain_vs_" << name << "," << name << "_peak_allocated_bytes," << name
        << "_peak_nvml_used_bytes," << name << "_run," << name << "_diverged_at_step";
  }
  // After every earlier column (--repeat): each ratio's range over its pairs and why it is noisy, if it is.
  csv << ",ptrain_vs_pytorch_eager_min,ptrain_vs_pytorch_eager_max,ptrain_vs_pytorch_eager_pairs,"
         "ptrain_vs_pytorch_eager_noisy,ptrain_vs_pytorch_compiled_min,ptrain_vs_pytorch_compiled_max,"
         "ptrain_vs_pytorch_compiled_pairs,ptrain_vs_pytorch_compiled_noisy";
  for (size_t m = 1; m < modes.size(); ++m) {
    std::string name = "ptrain_vs_pytorch_compiled_" + modes[m];
    for (auto& c : name) c = c == '-' ? '_' : c;
    csv << "," << name << "_min," << name << "_max," << name << "_pairs," << name << "_noisy";
  }
  csv << "\n";
  for (const auto& row : rows) {
    // Over several rounds (--repeat) a throughput is their median and a ratio the median of the pairs' ratios.
    const auto rounds_of = [&](std::optional<size_t> run) -> const std::vector<size_t>& {
      static const std::vector<size_t> none;
      if (!run) return none;
      if (run == row.ptrain) return row.ptrain_rounds;
      if (run == row.eager) return row.eager_rounds;
      for (size_t m = 0; m < row.compiled.size(); ++m)
        if (run == row.compiled[m]) return row.compiled_rounds[m];
      return none;
    };
    const auto throughput = [&](std::optional<size_t> run) {
      return run ? csv_number(median_throughput(report, rounds_of(run))) : std::string();
    };
    const auto ratio = [&](std::optional<size_t> other) {
      return csv_number(row.ptrain && other ? ratio_summary(report, row.ptrain_rounds, rounds_of(other)).median
                                            : std::nullopt);
    };
    const auto spread = [&](std::optional<size_t> other) -> std::vector<std::string> {
      if (!row.ptrain || !other) return {"", "", "", ""};
      const RatioSummary s = ratio_summary(report, row.ptrain_rounds, rounds_of(other));
      std::string why;
      for (const auto& reason : s.noisy) why += (why.empty() ? "" : "; ") + reason;
      return {csv_number(s.min), csv_number(s.max), std::to_string(s.pairs), why};
    };
    const auto peak = [&](std::optional<size_t> run) {
      return run ? csv_number(measured(record_of(report, *run).peak_allocated_bytes)) : std::string();
    };
    const auto device = [&](std::optional<size_t> run) {
      return run ? csv_number(measured(record_of(report, *run).peak_nvml_used_bytes)) : std::string();
    };
    const auto name = [&](std::optional<size_t> run) { return run ? report.runs[*run].name : std::string(); };
    const auto diverged = [&](std::optional<size_t> run) {
      return run ? csv_number(measured(record_of(report, *run).diverged_at_step)) : std::string();
    };
    const std::optional<size_t> compiled = row.compiled.front();
    std::vector<std::string> fields{
        row.model, row.dataset, std::to_string(row.image_size), row.seq_len ? std::to_string(*row.seq_len) : "",
        std::to_string(row.batch_size_per_device), row.precision, row.strategy, std::to_string(row.devices),
        row.channels_last ? (*row.channels_last ? "true" : "false") : "",
        row.seq_len ? "tokens" : "images", throughput(row.ptrain), throughput(row.eager), throughput(compiled),
        ratio(row.eager), ratio(compiled), peak(row.ptrain), peak(row.eager), peak(compiled),
        device(row.ptrain), device(row.eager), device(compiled), name(row.ptrain), name(row.eager), name(compiled),
        diverged(row.ptrain), diverged(row.eager), diverged(compiled), compiled ? modes.front() : ""};
    for (size_t m = 1; m < modes.size(); ++m) {
      const std::optional<size_t> run = row.compiled[m];
      fields.insert(fields.end(), {throughput(run), ratio(run), peak(run), device(run), name(run), diverged(run)});
    }
    for (const auto& other : std::vector<std::optional<size_t>>{row.eager, compiled}) {
      const auto more = spread(other);
      fields.insert(fields.end(), more.begin(), more.end());
    }
    for (size_t m = 1; m < modes.size(); ++m) {
      const auto more = spread(row.compiled[m]);
      fields.insert(fields.end(), more.begin(), more.end());
    }
    for (size_t c = 0; c < fields.size(); ++c) csv << (c ? "," : "") << csv_field(fields[c]);
    csv << "\n";
  }
  return csv.str();
}

}  // namespace ptrain::report
