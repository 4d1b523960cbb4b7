#include "ptrain/report/report_table.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <set>

namespace ptrain::report::table {

using metrics::RunRecord;

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

std::string percent_text(std::optional<double> percent, const char* format) {
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

const RunRecord& record_of(const Report& report, size_t run) { return report.runs[run].record; }

bool is_language_model_run(const RunRecord& r) {
  return r.seq_len.has_value() || r.dataset == "synthetic-tokens" || r.dataset == "text";
}

// ---------------------------------------------------------------------------------------------------
// The table.

namespace {

// What `ptrain estimate` predicted for the run before it ran (ptrain bench puts it in the record's extra).
std::optional<double> predicted_peak(const RunRecord& r) {
  const auto estimate = r.extra.find("estimate");
  if (estimate == r.extra.end() || !estimate->is_object()) return std::nullopt;
  const auto bytes = estimate->find("predicted_peak_allocated_bytes");
  if (bytes == estimate->end() || !bytes->is_number()) return std::nullopt;
  return bytes->get<double>();
}

}  // namespace

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
    add("throughput img/s", "images_per_second", true,
        number([](const Report& r, size_t i) { return measured(record_of(r, i).images_per_second); },
               throughput_text));
    add("steady img/s", "steady_images_per_second", true,
        number([](const Report& r, size_t i) { return measured(record_of(r, i).steady_images_per_second); },
               throughput_text));
    add("speed-up vs baseline", "speedup_vs_baseline", true,
        number(speedup_vs_baseline, [](std::optional<double> v) {
          return v ? printf_string("%.2fx", *v) : std::string(kNotAvailable);
        }));
    add("test accuracy", "final_test_accuracy", true,
        std::make_pair(
            std::function<std::string(const Report&, size_t)>([](const Report& r, size_t i) {
              const RunRecord& record = record_of(r, i);
              if (const auto diverged = divergence_text(record)) return *diverged;
              return fraction_as_percent_text(measured(record.final_test_accuracy));
            }),
            std::function<std::string(const Report&, size_t)>(
                [](const Report& r, size_t i) { return csv_number(measured(record_of(r, i).final_test_accuracy)); })));
    add("peak allocated", "peak_allocated_bytes_per_gpu", true,
        number([](const Report& r, size_t i) { return measured(record_of(r, i).peak_allocated_bytes); },
               gib_text));
    c.back().per_device = true;
    add("memory saved vs baseline", "memory_saved_vs_baseline_fraction", true,
        number(memory_saved_vs_baseline,
               [](std::optional<double> v) { return percent_text(v ? std::optional(*v * 100.0) : v, "%.1f%%"); }));
    add("predicted peak", "predicted_peak_allocated_bytes_per_gpu", true,
        number([](const Report& r, size_t i) { return predicted_peak(record_of(r, i)); }, gib_text));
    c.back().per_device = true;
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
    add("diverged at step", "diverged_at_step", true,
        number([](const Report& r, size_t i) { return measured(record_of(r, i).diverged_at_step); },
               [](std::optional<double> v) { return v ? shortest_number(*v) : std::string(); }));
    c.back().in_tables = false;  // the accuracy cell says it
    // Last, so that the CSV's earlier columns keep their places for readers that index them.
    add("MFU", "mfu", true,
        number([](const Report& r, size_t i) { return measured(record_of(r, i).mfu); },
               [](std::optional<double> v) { return fraction_as_percent_text(v); }));
    // After MFU for the same reason: how much the steady steps wobbled, and what the bench saw of the machine.
    const auto csv_only = [&](const char* name, auto get) {
      add(name, name, true, number(get, [](std::optional<double> v) { return csv_number(v); }));
      c.back().in_tables = false;
    };
    csv_only("steady_step_median_seconds",
             [](const Report& r, size_t i) { return measured(record_of(r, i).steady_step_median_seconds); });
    csv_only("steady_step_p10_seconds",
             [](const Report& r, size_t i) { return measured(record_of(r, i).steady_step_p10_seconds); });
    csv_only("steady_step_p90_seconds",
             [](const Report& r, size_t i) { return measured(record_of(r, i).steady_step_p90_seconds); });
    const auto bench_value = [](const RunRecord& record, const char* key) -> std::optional<double> {
      const auto bench = record.extra.find("bench");
      if (bench == record.extra.end() || !bench->is_object() || !bench->contains(key)) return std::nullopt;
      const auto& v = (*bench)[key];
      if (v.is_number()) return v.get<double>();
      if (v.is_array() && !v.empty() && v[0].is_number()) return v[0].get<double>();
      return std::nullopt;
    };
    csv_only("bench_repeat", [bench_value](const Report& r, size_t i) { return bench_value(record_of(r, i), "repeat"); });
    csv_only("load_average_before",
             [bench_value](const Report& r, size_t i) { return bench_value(record_of(r, i), "load_average_before"); });
    csv_only("load_average_after",
             [bench_value](const Report& r, size_t i) { return bench_value(record_of(r, i), "load_average_after"); });
    return c;
  }();
  return all;
}

std::string memory_unit(const Report& report) {
  const bool all_cuda = std::all_of(report.runs.begin(), report.runs.end(),
                                    [](const ReportRun& run) { return run.record.device.rfind("cuda", 0) == 0; });
  return all_cuda && !report.runs.empty() ? "GPU" : "device";
}

std::string column_title(const Column& column, const Report& report) {
  return column.per_device ? std::string(column.title) + "/" + memory_unit(report) : column.title;
}

const std::vector<Column>& table_columns() {
  static const std::vector<Column> shown = [] {
    std::vector<Column> c;
    for (const auto& column : columns()) {
      if (column.in_tables) c.push_back(column);
    }
    return c;
  }();
  return shown;
}

std::string run_descriptor(const RunRecord& r) {
  return framework_display_name(r.framework) + ", " + r.strategy + ", " + r.precision + ", " +
         std::to_string(r.devices) + (r.devices == 1 ? " device" : " devices") + ", batch " +
         std::to_string(r.batch_size_per_device) + "/device";
}

std::vector<std::string> table_notes(const Report& report) {
  std::vector<std::string> notes;
  std::vector<size_t> baselines;
  for (size_t i = 0; i < report.runs.size(); ++i) {
    if (report.is_baseline(i)) baselines.push_back(i);
  }
  const auto describe_baseline = [&](size_t i) {
    const ReportRun& base = report.runs[i];
    if (is_single_device_fp32_ptrain(base.record)) return base.name + " (the ptrain single-device fp32 run)";
    return base.name + " (" + run_descriptor(base.record) + "; no ptrain single-device fp32 run" +
           (baselines.size() > 1 ? " of " + job_of(base.record) : std::string(" among these records")) + ", so the first " +
           (base.record.framework == metrics::kFrameworkPtrain ? "ptrain run" : "run") + ")";
  };
  if (baselines.size() == 1) {
    notes.push_back("Baseline: " + describe_baseline(baselines.front()) + ".");
  } else {
    std::string list;
    for (const size_t i : baselines) list += (list.empty() ? "" : "; ") + describe_baseline(i);
    notes.push_back("The runs train " + std::to_string(baselines.size()) +
                    " jobs, and each run's speed-up and memory saved are against its own job's baseline: " + list +
                    (side_by_side(report).empty() ? "." : ". The side-by-side table below compares ptrain and PyTorch job by job."));
  }
  notes.push_back(
      "Throughput: training images per second over all devices, evaluation excluded; steady: the same from the "
      "end of the record's steady_from_step on (10 steps, or a quarter of a shorter run), once kernels are tuned "
      "and memory pools grown. Speed-up: steady throughput over the baseline's where both have one, else "
      "throughput over the whole training. Memory saved: 1 - peak "
      "allocator-allocated bytes per " + memory_unit(report) + " over the baseline's; negative means more memory than "
      "the baseline.");
  notes.push_back(
      "n/a: not measured (GPU memory and utilisation on a CPU or without NVML, accuracy without evaluation).");
  std::string diverged;
  for (const auto& run : report.runs) {
    if (const auto text = divergence_text(run.record)) diverged += (diverged.empty() ? "" : "; ") + run.name + " " + *text;
  }
  if (!diverged.empty()) {
    notes.push_back("Diverged: " + diverged +
                    ". From that step on the loss was not finite (or the loss scale sat at its floor) and the run "
                    "trained on: its accuracy and losses mean nothing, and its throughput is that of steps that no "
                    "longer learned.");
  }
  return notes;
}

std::string input_size_text(const RunRecord& r) {
  return r.seq_len ? std::to_string(*r.seq_len) + " tokens" : std::to_string(r.image_size) + " px";
}

std::string job_summary(const Report& report) {
  std::set<std::string> jobs;
  for (const auto& run : report.runs) {
    const RunRecord& r = run.record;
    jobs.insert(r.model + " on " + r.dataset + " (" + input_size_text(r) + ")");
  }
  std::string list;
  for (const auto& job : jobs) list += (list.empty() ? "" : ", ") + job;
  return std::to_string(report.runs.size()) + (report.runs.size() == 1 ? " run" : " runs") + ": " + list + ".";
}

// ---------------------------------------------------------------------------------------------------
// Side by side: ptrain, PyTorch eager and PyTorch compiled per job and mode.

// Steady throughput where measured, else over the whole training; in tokens for language models.
std::optional<double> shown_throughput(const RunRecord& r) {
  if (is_language_model_run(r)) {
    if (const auto steady = measured(r.steady_tokens_per_second)) return steady;
    return measured(r.tokens_per_second);
  }
  if (const auto steady = measured(r.steady_images_per_second)) return steady;
  return measured(r.images_per_second);
}

std::optional<std::string> divergence_text(const RunRecord& r) {
  if (!r.diverged_at_step) return std::nullopt;
  return "diverged at step " + std::to_string(*r.diverged_at_step);
}

namespace {

const char* throughput_unit(const SideBySideRow& row) { return row.seq_len ? "tokens/s" : "img/s"; }

std::string side_by_side_data(const SideBySideRow& row) {
  return row.dataset + (row.seq_len ? ", " + std::to_string(*row.seq_len) + " tokens"
                                    : row.image_size > 0 ? ", " + std::to_string(row.image_size) + " px" : "") +
         ", batch " + std::to_string(row.batch_size_per_device);
}

std::string side_by_side_format(const SideBySideRow& row) {
  return !row.channels_last ? "-" : *row.channels_last ? "channels-last" : "NCHW";
}

std::string ratio_summary_text(const RatioSummary& s) {
  if (!s.median) return kNotAvailable;
  std::string text = printf_string("%.2fx", *s.median);
  if (s.pairs > 1) {
    text += " (" + printf_string("%.2f", *s.min) + "-" + printf_string("%.2fx", *s.max) + ", " +
            std::to_string(s.pairs) + " pairs)";
  }
  return s.noisy.empty() ? text : text + " noisy";
}

}  // namespace

std::optional<double> median_throughput(const Report& report, const std::vector<size_t>& rounds) {
  std::vector<double> values;
  for (size_t i : rounds) {
    if (const auto t = shown_throughput(record_of(report, i))) values.push_back(*t);
  }
  return median_of(values);
}

std::vector<std::string> noise_notes(const Report& report) {
  std::vector<std::string> notes;
  const std::string load = machine_load_text(report);
  if (!load.empty()) notes.push_back("Machine load during the bench: " + load + ".");
  const auto modes = side_by_side_compile_modes(report);
  bool rounds = false;
  for (const auto& row : side_by_side(report)) {
    rounds = rounds || row.ptrain_rounds.size() > 1;
    std::vector<std::pair<std::string, const std::vector<size_t>*>> cells{{"ptrain / eager", &row.eager_rounds}};
    for (size_t m = 0; m < row.compiled_rounds.size(); ++m)
      cells.emplace_back("ptrain / " + compiled_column_name(modes[m]), &row.compiled_rounds[m]);
    for (const auto& [name, other] : cells) {
      const RatioSummary summary = ratio_summary(report, row.ptrain_rounds, *other);
      if (summary.noisy.empty()) continue;
      std::string why;
      for (const auto& reason : summary.noisy) why += (why.empty() ? "" : "; ") + reason;
      notes.push_back("Noisy: " + row.model + " " + row.precision + ", " + std::to_string(row.devices) + " " +
                      row.strategy + ", batch " + std::to_string(row.batch_size_per_device) + ", " + name + ": " + why +
                      ".");
    }
  }
  if (rounds) {
    notes.insert(notes.begin() + (load.empty() ? 0 : 1),
                 "Rounds (ptrain bench --repeat): each throughput is the median of its rounds, each ratio the median "
                 "of the rounds' ratios (ptrain's round k over PyTorch's round k, run one after the other) with its "
                 "range (min-max). A cell is noisy when its range crosses 1.0, when a side's throughput varies more "
                 "than 5% over its rounds, when a run's steady steps spread more than 5% (p10 to p90 over the "
                 "median), or when a run stalled (a step over 3x its median).");
  }
  return notes;
}

std::string compiled_column_name(const std::string& mode) {
  return mode.empty() ? "compiled" : "compiled (" + mode + ")";
}

std::vector<std::string> side_by_side_titles(const Report& report) {
  const std::string per = "/" + memory_unit(report);
  const auto modes = side_by_side_compile_modes(report);
  std::vector<std::string> titles{"model", "data", "precision", "devices", "memory format", "ptrain", "PyTorch eager"};
  for (const auto& m : modes) titles.push_back("PyTorch " + compiled_column_name(m));
  titles.push_back("ptrain / eager");
  for (const auto& m : modes) titles.push_back("ptrain / " + compiled_column_name(m));
  titles.insert(titles.end(), {"ptrain peak" + per, "eager peak" + per});
  for (const auto& m : modes) titles.push_back(compiled_column_name(m) + " peak" + per);
  titles.insert(titles.end(), {"ptrain device" + per, "eager device" + per});
  for (const auto& m : modes) titles.push_back(compiled_column_name(m) + " device" + per);
  return titles;
}

std::vector<std::string> side_by_side_cells(const Report& report, const SideBySideRow& row) {
  // Over several rounds a throughput is their median, as the ratio beside it is.
  const auto throughput_of = [&](std::optional<size_t> run, const std::vector<size_t>& rounds) {
    if (!run) return std::string(kNotAvailable);
    const RunRecord& r = record_of(report, *run);
    const auto value = rounds.size() > 1 ? median_throughput(report, rounds) : shown_throughput(r);
    const std::string text = value ? throughput_text(value) + " " + throughput_unit(row) : std::string(kNotAvailable);
    const auto diverged = divergence_text(r);
    return diverged ? text + " (" + *diverged + ")" : text;
  };
  const auto ratio_of = [&](const std::vector<size_t>& other) {
    return ratio_summary_text(ratio_summary(report, row.ptrain_rounds, other));
  };
  const auto peak = [&](std::optional<size_t> run) {
    return run ? gib_text(measured(record_of(report, *run).peak_allocated_bytes)) : std::string(kNotAvailable);
  };
  const auto device = [&](std::optional<size_t> run) {
    return run ? gib_text(measured(record_of(report, *run).peak_nvml_used_bytes)) : std::string(kNotAvailable);
  };
  std::vector<std::string> cells{row.model, side_by_side_data(row), row.precision,
                                 std::to_string(row.devices) + ", " + row.strategy, side_by_side_format(row),
                                 throughput_of(row.ptrain, row.ptrain_rounds), throughput_of(row.eager, row.eager_rounds)};
  for (size_t m = 0; m < row.compiled.size(); ++m) cells.push_back(throughput_of(row.compiled[m], row.compiled_rounds[m]));
  cells.push_back(ratio_of(row.eager_rounds));
  for (const auto& rounds : row.compiled_rounds) cells.push_back(ratio_of(rounds));
  cells.insert(cells.end(), {peak(row.ptrain), peak(row.eager)});
  for (const auto& run : row.compiled) cells.push_back(peak(run));
  cells.insert(cells.end(), {device(row.ptrain), device(row.eager)});
  for (const auto& run : row.compiled) cells.push_back(device(run));
  return cells;
}

const char* const kSideBySideHeading = "ptrain beside PyTorch";

std::string side_by_side_note(const Report& report) {
  std::vector<std::string> modes = side_by_side_compile_modes(report);
  if (modes == std::vector<std::string>{""}) modes = {"default"};
  std::string graphs;  // the modes that replay CUDA graphs
  for (const auto& m : modes) {
    if (m == "reduce-overhead" || m == "max-autotune") graphs += (graphs.empty() ? "" : " and ") + m;
  }
  std::string mode;
  if (modes == std::vector<std::string>{"default"}) {
    mode = "default mode";
  } else if (modes.size() == 1) {
    mode = "mode " + modes.front() + (graphs.empty() ? "" : ": forward and backward replayed as CUDA graphs");
  } else {
    mode = "in the mode each of its columns names" +
           (graphs.empty() ? std::string() : "; " + graphs + ": forward and backward replayed as CUDA graphs");
  }
  return "Steady throughput (from the end of each record's steady_from_step on; over the whole training where a run "
         "has no steady figure), in tokens per second for language models. Ratios: ptrain's over PyTorch's, above 1 "
         "when ptrain is faster. PyTorch eager is the classic comparison in ptrain's memory format; PyTorch compiled "
         "is torch.compile (" + mode + ") with channels-last for convolutional models and the fused optimizer step, "
         "beside each memory format of ptrain's. Peak: allocator-allocated bytes per " + memory_unit(report) +
         "; device: the device memory in use as nvidia-smi shows it (NVML, sampled during the run), which adds the "
         "allocator's cached blocks, CUDA graph pools and the CUDA context.";
}

}  // namespace ptrain::report::table
