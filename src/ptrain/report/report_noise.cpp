// How far a bench figure can be trusted: the ratios of a side-by-side cell over the rounds of `ptrain bench
// --repeat`, and the rules that call a cell noisy (report.h, RatioSummary). A ratio of one pair read 0.03x
// and then 1.56x on a busy machine: one sample says nothing of that, its rounds and their spread do.
#include <algorithm>
#include <cstdio>

#include "ptrain/metrics/run_record.h"
#include "ptrain/report/report.h"
#include "ptrain/report/report_table.h"

namespace ptrain::report {

using metrics::RunRecord;

namespace {

std::string percent(double fraction) { return table::printf_string("%.0f%%", fraction * 100.0); }

// The record's round under --repeat; 0 where the bench did not say (records before the field, other tools').
int64_t round_of(const RunRecord& r) {
  const auto bench = r.extra.find("bench");
  if (bench == r.extra.end() || !bench->is_object()) return 0;
  const auto repeat = bench->find("repeat");
  return repeat != bench->end() && repeat->is_number_integer() ? repeat->get<int64_t>() : 0;
}

// The 1-minute load averages the bench read before and after the run; empty where it read none.
std::vector<double> loads_of(const RunRecord& r) {
  std::vector<double> loads;
  const auto bench = r.extra.find("bench");
  if (bench == r.extra.end() || !bench->is_object()) return loads;
  for (const char* key : {"load_average_before", "load_average_after"}) {
    const auto load = bench->find(key);
    if (load != bench->end() && load->is_array() && !load->empty() && (*load)[0].is_number())
      loads.push_back((*load)[0].get<double>());
  }
  return loads;
}

int64_t cores_of(const Report& report) {
  for (const auto& run : report.runs) {
    const auto bench = run.record.extra.find("bench");
    if (bench != run.record.extra.end() && bench->is_object() && bench->contains("cores") &&
        (*bench)["cores"].is_number_integer())
      return (*bench)["cores"].get<int64_t>();
  }
  return 0;
}

// Runs in round order (stable: runs without a round keep the report's order).
std::vector<size_t> by_round(const Report& report, std::vector<size_t> runs) {
  std::stable_sort(runs.begin(), runs.end(), [&](size_t a, size_t b) {
    return round_of(report.runs[a].record) < round_of(report.runs[b].record);
  });
  return runs;
}

}  // namespace

std::optional<double> median_of(const std::vector<double>& values) { return metrics::quantile(values, 0.5); }

std::optional<double> relative_range(std::vector<double> values) {
  if (values.size() < 2) return std::nullopt;
  const auto median = median_of(values);
  if (!median || *median <= 0) return std::nullopt;
  const auto [low, high] = std::minmax_element(values.begin(), values.end());
  return (*high - *low) / *median;
}

std::optional<double> step_spread(const RunRecord& r) {
  const auto median = table::measured(r.steady_step_median_seconds);
  const auto p10 = table::measured(r.steady_step_p10_seconds);
  const auto p90 = table::measured(r.steady_step_p90_seconds);
  if (!median || !p10 || !p90 || *median <= 0) return std::nullopt;
  return (*p90 - *p10) / *median;
}

std::optional<double> stall(const RunRecord& r) {
  const auto median = table::measured(r.steady_step_median_seconds);
  if (!median || *median <= 0 || r.steady_step_seconds.empty()) return std::nullopt;
  const double slowest = *std::max_element(r.steady_step_seconds.begin(), r.steady_step_seconds.end());
  const double factor = slowest / *median;
  return factor > kStallFactor ? std::optional(factor) : std::nullopt;
}

RatioSummary ratio_summary(const Report& report, const std::vector<size_t>& ptrain, const std::vector<size_t>& other) {
  RatioSummary summary;
  const std::vector<size_t> mine = by_round(report, ptrain), theirs = by_round(report, other);
  std::vector<double> ratios;
  for (size_t k = 0; k < std::min(mine.size(), theirs.size()); ++k) {
    if (const auto ratio = throughput_ratio(report, mine[k], theirs[k])) ratios.push_back(*ratio);
  }
  summary.pairs = ratios.size();
  if (ratios.empty()) return summary;
  summary.median = median_of(ratios);
  summary.min = *std::min_element(ratios.begin(), ratios.end());
  summary.max = *std::max_element(ratios.begin(), ratios.end());
  if (*summary.min < 1.0 && *summary.max > 1.0) {
    summary.noisy.push_back("the ratio's range " + table::printf_string("%.2f", *summary.min) + "-" +
                            table::printf_string("%.2fx", *summary.max) + " crosses 1.0");
  }
  for (const auto* side : {&mine, &theirs}) {
    if (side->empty()) continue;
    std::vector<double> throughputs;
    for (size_t i : *side) {
      if (const auto t = table::shown_throughput(report.runs[i].record)) throughputs.push_back(*t);
    }
    const std::string who = table::framework_display_name(report.runs[side->front()].record.framework);
    if (const auto range = relative_range(throughputs); range && *range > kNoisySpread) {
      summary.noisy.push_back(who + "'s throughput varies " + percent(*range) + " over its " +
                              std::to_string(throughputs.size()) + " rounds");
    }
    for (size_t i : *side) {
      const RunRecord& r = report.runs[i].record;
      if (const auto spread = step_spread(r); spread && *spread > kNoisySpread) {
        summary.noisy.push_back(report.runs[i].name + "'s steady steps spread " + percent(*spread) +
                                " (p10 to p90 over the median)");
      }
      if (const auto factor = stall(r)) {
        summary.noisy.push_back(report.runs[i].name + " stalled: a step took " +
                                table::printf_string("%.1fx", *factor) + " its median");
      }
    }
  }
  if (!summary.noisy.empty()) {
    std::vector<double> loads;
    for (const auto* side : {&mine, &theirs}) {
      for (size_t i : *side) {
        const auto l = loads_of(report.runs[i].record);
        loads.insert(loads.end(), l.begin(), l.end());
      }
    }
    if (!loads.empty()) {
      const auto [low, high] = std::minmax_element(loads.begin(), loads.end());
      const int64_t cores = cores_of(report);
      summary.noisy.push_back("load average " + table::printf_string("%.1f", *low) + " to " +
                              table::printf_string("%.1f", *high) + " around its runs" +
                              (cores > 0 ? " on " + std::to_string(cores) + " cores" : std::string()));
    }
  }
  return summary;
}

std::string machine_load_text(const Report& report) {
  std::vector<double> loads;
  size_t runs = 0;
  for (const auto& run : report.runs) {
    const auto l = loads_of(run.record);
    if (l.empty()) continue;
    ++runs;
    loads.insert(loads.end(), l.begin(), l.end());
  }
  if (loads.empty()) return "";
  const auto [low, high] = std::minmax_element(loads.begin(), loads.end());
  const int64_t cores = cores_of(report);
  return "load average (1 min) " + table::printf_string("%.1f", *low) + " to " + table::printf_string("%.1f", *high) +
         " around the " + std::to_string(runs) + (runs == 1 ? " run" : " runs") +
         (cores > 0 ? ", on " + std::to_string(cores) + " cores" : std::string());
}

}  // namespace ptrain::report
