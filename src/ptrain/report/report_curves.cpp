#include "ptrain/report/report_curves.h"

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "ptrain/report/report.h"

namespace ptrain::report {

namespace {

std::optional<double> finite_number(const nlohmann::json& record, const char* key) {
  if (!record.contains(key) || !record[key].is_number()) return std::nullopt;
  const double value = record[key].get<double>();
  return std::isfinite(value) ? std::optional<double>(value) : std::nullopt;
}

std::string step_text(int64_t step) { return "step " + std::to_string(step); }

}  // namespace

std::string step_log_path_of(const std::string& record_path) {
  return std::filesystem::path(record_path).replace_extension(".log.jsonl").string();
}

std::vector<LoggedStep> read_step_log(const std::string& path) {
  std::vector<LoggedStep> steps;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const auto record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_object() || record.value("kind", "") != "step" || !record.contains("step") ||
        !record["step"].is_number_integer())
      continue;
    LoggedStep step;
    step.step = record["step"].get<int64_t>();
    step.loss = finite_number(record, "train/loss");
    step.throughput = finite_number(record, "train/images_per_s");
    if (!step.throughput) {
      step.throughput = finite_number(record, "train/tokens_per_s");
      step.tokens = step.throughput.has_value();
    }
    steps.push_back(step);
  }
  return steps;
}

std::vector<CurvePoint> loss_per_step(const ReportRun& run) {
  std::vector<CurvePoint> points;
  if (!run.logged_steps.empty()) {
    for (const auto& s : run.logged_steps)
      if (s.loss) points.push_back({static_cast<double>(s.step), *s.loss, step_text(s.step)});
    return points;
  }
  const auto& r = run.record;
  if (r.global_batch_size <= 0) return points;
  int64_t images = 0;
  for (const auto& epoch : r.epochs_detail) {
    images += epoch.images;
    const int64_t step = images / r.global_batch_size;
    if (std::isfinite(epoch.train_loss))
      points.push_back({static_cast<double>(step), epoch.train_loss,
                        step_text(step) + " (epoch " + std::to_string(epoch.epoch) + "'s mean)"});
  }
  return points;
}

std::vector<CurvePoint> throughput_per_step(const ReportRun& run) {
  std::vector<CurvePoint> points;
  for (const auto& s : run.logged_steps)
    if (s.throughput)
      points.push_back({static_cast<double>(s.step), *s.throughput,
                        step_text(s.step) + (s.tokens ? " (tokens/s)" : " (images/s)")});
  return points;
}

}  // namespace ptrain::report
