#include "ptrain/metrics/run_record.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "ptrain/core/error.h"
#include "ptrain/io/atomic_file.h"

namespace ptrain::metrics {
namespace {

using nlohmann::json;

json number_or_null(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

template <typename T>
json optional_or_null(const std::optional<T>& v) {
  if (!v) return nullptr;
  if constexpr (std::is_floating_point_v<T>) return number_or_null(*v);
  return *v;
}

const json& field(const json& object, const std::string& key, const std::string& where) {
  check(object.is_object(), where + ": expected a JSON object");
  const auto it = object.find(key);
  check(it != object.end(), where + ": missing key '" + key + "'");
  return *it;
}

std::string read_string(const json& o, const std::string& key, const std::string& where) {
  const json& v = field(o, key, where);
  check(v.is_string(), where + ": key '" + key + "' must be a string");
  return v.get<std::string>();
}

int64_t read_int(const json& o, const std::string& key, const std::string& where) {
  const json& v = field(o, key, where);
  check(v.is_number_integer(), where + ": key '" + key + "' must be an integer");
  return v.get<int64_t>();
}

double read_double(const json& o, const std::string& key, const std::string& where) {
  const json& v = field(o, key, where);
  if (v.is_null()) return std::numeric_limits<double>::quiet_NaN();
  check(v.is_number(), where + ": key '" + key + "' must be a number");
  return v.get<double>();
}

template <typename T>
std::optional<T> read_optional(const json& o, const std::string& key, const std::string& where) {
  const json& v = field(o, key, where);
  if (v.is_null()) return std::nullopt;
  if constexpr (std::is_integral_v<T>) {
    check(v.is_number_integer(), where + ": key '" + key + "' must be an integer or null");
  } else {
    check(v.is_number(), where + ": key '" + key + "' must be a number or null");
  }
  return v.get<T>();
}

std::optional<bool> read_optional_bool(const json& o, const std::string& key, const std::string& where) {
  const json& v = field(o, key, where);
  if (v.is_null()) return std::nullopt;
  check(v.is_boolean(), where + ": key '" + key + "' must be true, false or null");
  return v.get<bool>();
}

EpochRecord epoch_from_json(const json& o, const std::string& where) {
  EpochRecord e;
  e.epoch = read_int(o, "epoch", where);
  e.wall_seconds = read_double(o, "wall_seconds", where);
  e.train_loss = read_double(o, "train_loss", where);
  e.train_accuracy = read_optional<double>(o, "train_accuracy", where);
  e.test_loss = read_optional<double>(o, "test_loss", where);
  e.test_accuracy = read_optional<double>(o, "test_accuracy", where);
  e.images_per_second = read_double(o, "images_per_second", where);
  e.images = read_int(o, "images", where);
  return e;
}

}  // namespace

std::optional<double> quantile(std::vector<double> values, double q) {
  if (values.empty()) return std::nullopt;
  std::sort(values.begin(), values.end());
  const double at = std::clamp(q, 0.0, 1.0) * static_cast<double>(values.size() - 1);
  const auto below = static_cast<size_t>(std::floor(at));
  const size_t above = std::min(below + 1, values.size() - 1);
  return values[below] + (values[above] - values[below]) * (at - static_cast<double>(below));
}

void set_steady_steps(RunRecord& r, std::vector<double> seconds, std::string timing) {
  r.steady_step_median_seconds = quantile(seconds, 0.5);
  r.steady_step_p10_seconds = quantile(seconds, 0.1);
  r.steady_step_p90_seconds = quantile(seconds, 0.9);
  r.steady_step_timing = seconds.empty() ? "" : std::move(timing);
  r.steady_step_seconds = std::move(seconds);
}

json to_json(const EpochRecord& e) {
  return json{{"epoch", e.epoch},
              {"wall_seconds", number_or_null(e.wall_seconds)},
              {"train_loss", number_or_null(e.train_loss)},
              {"train_accuracy", optional_or_null(e.train_accuracy)},
              {"test_loss", optional_or_null(e.test_loss)},
              {"test_accuracy", optional_or_null(e.test_accuracy)},
              {"images_per_second", number_or_null(e.images_per_second)},
              {"images", e.images}};
}

json to_json(const RunRecord& r) {
  json epochs = json::array();
  for (const auto& e : r.epochs_detail) epochs.push_back(to_json(e));
  json steps = json::array();
  for (double s : r.steady_step_seconds) steps.push_back(number_or_null(s));
  return json{{"schema_version", kRunRecordSchemaVersion},
              {"framework", r.framework},
              {"ptrain_version", r.ptrain_version},
              {"torch_version", r.torch_version},
              {"command_line", r.command_line},
              {"model", r.model},
              {"dataset", r.dataset},
              {"precision", r.precision},
              {"strategy", r.strategy},
              {"device", r.device},
              {"world_size", r.world_size},
              {"devices", r.devices},
              {"batch_size_per_device", r.batch_size_per_device},
              {"global_batch_size", r.global_batch_size},
              {"epochs", r.epochs},
              {"steps", r.steps},
              {"image_size", r.image_size},
              {"total_wall_seconds", number_or_null(r.total_wall_seconds)},
              {"train_wall_seconds", number_or_null(r.train_wall_seconds)},
              {"images_per_second", number_or_null(r.images_per_second)},
              {"steady_images_per_second", optional_or_null(r.steady_images_per_second)},
              {"steady_from_step", optional_or_null(r.steady_from_step)},
              {"steady_step_seconds", steps},
              {"steady_step_timing", r.steady_step_timing},
              {"steady_step_median_seconds", optional_or_null(r.steady_step_median_seconds)},
              {"steady_step_p10_seconds", optional_or_null(r.steady_step_p10_seconds)},
              {"steady_step_p90_seconds", optional_or_null(r.steady_step_p90_seconds)},
              {"seq_len", optional_or_null(r.seq_len)},
              {"tokens_per_second", optional_or_null(r.tokens_per_second)},
              {"steady_tokens_per_second", optional_or_null(r.steady_tokens_per_second)},
              {"model_flops_per_step", optional_or_null(r.model_flops_per_step)},
              {"tflops", optional_or_null(r.tflops)},
              {"mfu", optional_or_null(r.mfu)},
              {"peak_tflops", optional_or_null(r.peak_tflops)},
              {"peak_tflops_basis", r.peak_tflops_basis},
              {"compiled", optional_or_null(r.compiled)},
              {"fused_optimizer", optional_or_null(r.fused_optimizer)},
              {"peak_allocated_bytes", optional_or_null(r.peak_allocated_bytes)},
              {"peak_reserved_bytes", optional_or_null(r.peak_reserved_bytes)},
              {"peak_nvml_used_bytes", optional_or_null(r.peak_nvml_used_bytes)},
              {"gpu_util_mean", optional_or_null(r.gpu_util_mean)},
              {"gpu_util_peak", optional_or_null(r.gpu_util_peak)},
              {"host_peak_rss_bytes", r.host_peak_rss_bytes},
              {"model_state_param_bytes", optional_or_null(r.model_state_param_bytes)},
              {"model_state_grad_bytes", optional_or_null(r.model_state_grad_bytes)},
              {"model_state_optimizer_bytes", optional_or_null(r.model_state_optimizer_bytes)},
              {"final_test_accuracy", optional_or_null(r.final_test_accuracy)},
              {"final_test_loss", optional_or_null(r.final_test_loss)},
              {"channels_last", optional_or_null(r.channels_last)},
              {"cuda_graphs", optional_or_null(r.cuda_graphs)},
              {"cuda_graphs_note", r.cuda_graphs_note},
              {"kernels", r.kernels},
              {"step_phase_seconds", r.step_phase_seconds},
              {"diverged_at_step", optional_or_null(r.diverged_at_step)},
              {"checkpoint_blocking_seconds", optional_or_null(r.checkpoint_blocking_seconds)},
              {"checkpoint_write_seconds", optional_or_null(r.checkpoint_write_seconds)},
              {"epochs_detail", epochs},
              {"environment", r.environment},
              {"extra", r.extra}};
}

RunRecord run_record_from_json(const json& o) {
  const std::string where = "run record";
  const int64_t version = read_int(o, "schema_version", where);
  check(version == kRunRecordSchemaVersion, where + ": schema_version " + std::to_string(version) +
                                                " is not the supported " +
                                                std::to_string(kRunRecordSchemaVersion));
  RunRecord r;
  // Optional because records written before PyTorch references shared the format have none.
  if (o.contains("framework")) r.framework = read_string(o, "framework", where);
  check(r.framework == kFrameworkPtrain || r.framework == kFrameworkPytorch,
        where + ": key 'framework' must be \"" + kFrameworkPtrain + "\" or \"" + kFrameworkPytorch + "\", not \"" +
            r.framework + "\"");
  const bool without_ptrain_version =
      r.framework == kFrameworkPytorch && (!o.contains("ptrain_version") || o["ptrain_version"].is_null());
  if (!without_ptrain_version) r.ptrain_version = read_string(o, "ptrain_version", where);
  r.torch_version = read_string(o, "torch_version", where);
  r.command_line = read_string(o, "command_line", where);
  r.model = read_string(o, "model", where);
  r.dataset = read_string(o, "dataset", where);
  r.precision = read_string(o, "precision", where);
  r.strategy = read_string(o, "strategy", where);
  r.device = read_string(o, "device", where);
  r.world_size = read_int(o, "world_size", where);
  r.devices = o.contains("devices") ? read_int(o, "devices", where) : r.world_size;  // records before dp had none
  r.batch_size_per_device = read_int(o, "batch_size_per_device", where);
  r.global_batch_size = read_int(o, "global_batch_size", where);
  r.epochs = read_int(o, "epochs", where);
  r.steps = read_int(o, "steps", where);
  r.image_size = read_int(o, "image_size", where);
  r.total_wall_seconds = read_double(o, "total_wall_seconds", where);
  r.train_wall_seconds = read_double(o, "train_wall_seconds", where);
  r.images_per_second = read_double(o, "images_per_second", where);
  r.peak_allocated_bytes = read_optional<int64_t>(o, "peak_allocated_bytes", where);
  r.peak_reserved_bytes = read_optional<int64_t>(o, "peak_reserved_bytes", where);
  r.peak_nvml_used_bytes = read_optional<int64_t>(o, "peak_nvml_used_bytes", where);
  r.gpu_util_mean = read_optional<double>(o, "gpu_util_mean", where);
  r.gpu_util_peak = read_optional<double>(o, "gpu_util_peak", where);
  r.host_peak_rss_bytes = read_int(o, "host_peak_rss_bytes", where);
  // Absent in records written before they existed.
  for (auto [key, value] : {std::pair{"model_state_param_bytes", &r.model_state_param_bytes},
                            std::pair{"model_state_grad_bytes", &r.model_state_grad_bytes},
                            std::pair{"model_state_optimizer_bytes", &r.model_state_optimizer_bytes},
                            std::pair{"steady_from_step", &r.steady_from_step},
                            std::pair{"diverged_at_step", &r.diverged_at_step}}) {
    if (o.contains(key)) *value = read_optional<int64_t>(o, key, where);
  }
  for (auto [key, value] : {std::pair{"steady_images_per_second", &r.steady_images_per_second},
                            std::pair{"tokens_per_second", &r.tokens_per_second},
                            std::pair{"steady_tokens_per_second", &r.steady_tokens_per_second},
                            std::pair{"model_flops_per_step", &r.model_flops_per_step},
                            std::pair{"tflops", &r.tflops}, std::pair{"mfu", &r.mfu},
                            std::pair{"peak_tflops", &r.peak_tflops},
                            std::pair{"steady_step_median_seconds", &r.steady_step_median_seconds},
                            std::pair{"steady_step_p10_seconds", &r.steady_step_p10_seconds},
                            std::pair{"steady_step_p90_seconds", &r.steady_step_p90_seconds},
                            std::pair{"checkpoint_blocking_seconds", &r.checkpoint_blocking_seconds},
                            std::pair{"checkpoint_write_seconds", &r.checkpoint_write_seconds}}) {
    if (o.contains(key)) *value = read_optional<double>(o, key, where);
  }
  if (o.contains("steady_step_seconds")) {
    const json& steps = o["steady_step_seconds"];
    check(steps.is_array(), where + ": key 'steady_step_seconds' must be an array");
    for (const auto& s : steps) {
      check(s.is_number() || s.is_null(), where + ": key 'steady_step_seconds' must hold numbers");
      r.steady_step_seconds.push_back(s.is_null() ? std::numeric_limits<double>::quiet_NaN() : s.get<double>());
    }
  }
  if (o.contains("steady_step_timing")) r.steady_step_timing = read_string(o, "steady_step_timing", where);
  if (o.contains("peak_tflops_basis")) r.peak_tflops_basis = read_string(o, "peak_tflops_basis", where);
  if (o.contains("seq_len")) r.seq_len = read_optional<int64_t>(o, "seq_len", where);
  for (auto [key, value] : {std::pair{"compiled", &r.compiled}, std::pair{"fused_optimizer", &r.fused_optimizer}}) {
    if (o.contains(key)) *value = read_optional_bool(o, key, where);
  }
  r.final_test_accuracy = read_optional<double>(o, "final_test_accuracy", where);
  r.final_test_loss = read_optional<double>(o, "final_test_loss", where);
  // Absent in records written before they existed.
  for (auto [key, value] : {std::pair{"channels_last", &r.channels_last}, std::pair{"cuda_graphs", &r.cuda_graphs}}) {
    if (!o.contains(key) || o[key].is_null()) continue;
    check(o[key].is_boolean(), where + ": key '" + std::string(key) + "' must be true, false or null");
    *value = o[key].get<bool>();
  }
  if (o.contains("cuda_graphs_note")) r.cuda_graphs_note = read_string(o, "cuda_graphs_note", where);
  if (o.contains("kernels")) {
    r.kernels = o["kernels"];
    check(r.kernels.is_object(), where + ": key 'kernels' must be an object");
  }
  if (o.contains("step_phase_seconds")) {
    r.step_phase_seconds = o["step_phase_seconds"];
    check(r.step_phase_seconds.is_null() || r.step_phase_seconds.is_object(),
          where + ": key 'step_phase_seconds' must be an object or null");
  }
  const json& epochs = field(o, "epochs_detail", where);
  check(epochs.is_array(), where + ": key 'epochs_detail' must be an array");
  for (size_t i = 0; i < epochs.size(); ++i) {
    r.epochs_detail.push_back(epoch_from_json(epochs[i], where + ": epochs_detail[" + std::to_string(i) + "]"));
  }
  r.environment = field(o, "environment", where);
  check(r.environment.is_object(), where + ": key 'environment' must be an object");
  r.extra = field(o, "extra", where);
  check(r.extra.is_object(), where + ": key 'extra' must be an object");
  return r;
}

// Through io's one atomic writer (temporary file beside it, fsync, rename, fsync of the directory): a run
// killed while writing leaves the previous record or none, never half of one.
void write_run_record(const std::string& path, const RunRecord& record) {
  io::write_file_atomically(path, to_json(record).dump(2) + "\n");
}

}  // namespace ptrain::metrics
