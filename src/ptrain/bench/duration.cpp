#include "ptrain/bench/duration.h"

#include <cmath>
#include <cstdio>
#include <algorithm>
#include <map>
#include <tuple>

#include "ptrain/models/zoo.h"

namespace ptrain::bench {

double assumed_mfu(metrics::MathRate rate) {
  switch (rate) {
    case metrics::MathRate::kFp32: return 0.35;
    case metrics::MathRate::kTf32: return 0.17;
    case metrics::MathRate::kHalf: return 0.15;
    case metrics::MathRate::kFp8: return 0.10;
  }
  return 0.15;
}

double step_seconds_from_flops(double forward_flops_per_sample, int64_t batch_per_device, double peak_flops_per_second,
                               double mfu) {
  return 3.0 * forward_flops_per_sample * static_cast<double>(batch_per_device) / (peak_flops_per_second * mfu);
}

std::optional<double> forward_flops_per_sample(const config::TrainConfig& c) {
  try {
    const std::string& name = c.model.name;
    const auto zoo = models::model_names();
    if (std::find(zoo.begin(), zoo.end(), name) == zoo.end()) return std::nullopt;  // a TorchScript file
    if (models::is_language_model(name)) {
      int64_t seq_len = c.data.seq_len;
      // synthetic-tokens' data path is N:T:V, T the sequence
      const auto colon = c.data.path.find(':');
      if (seq_len <= 0 && colon != std::string::npos) seq_len = std::stoll(c.data.path.substr(colon + 1));
      models::ModelSpec spec{name, c.model.vocab_size > 0 ? c.model.vocab_size : 50257, 0, 0, seq_len};
      spec.layers = c.model.gpt_layers;
      spec.width = c.model.gpt_width;
      spec.heads = c.model.gpt_heads;
      const auto parameters = models::parameters_without_building(spec);
      if (!parameters || seq_len <= 0) return std::nullopt;
      return 2.0 * static_cast<double>(*parameters) * static_cast<double>(seq_len);
    }
    const bool mnist = c.data.dataset.find("mnist") != std::string::npos;
    const bool cifar = c.data.dataset.find("cifar") != std::string::npos;
    const int64_t channels = mnist ? 1 : 3;
    const int64_t size = c.data.image_size > 0 ? c.data.image_size : mnist ? 28 : cifar ? 32 : 224;
    // Built once per shape: a bench asks for the same model in every run.
    static std::map<std::tuple<std::string, int64_t, int64_t>, std::optional<double>> built;
    const auto key = std::make_tuple(name, channels, size);
    auto found = built.find(key);
    if (found == built.end()) {
      const auto model = models::make_model({name, 10, channels, size});
      found = built.emplace(key, model->forward_flops({channels, size, size})).first;
    }
    return found->second;
  } catch (const std::exception&) {
    return std::nullopt;  // the estimate goes without this job's step time; the run's own errors come later
  }
}

std::string gpu_flops_basis(const std::string& device_name, const std::string& peak_basis) {
  char text[200];
  std::snprintf(text, sizeof(text), "from model FLOPs at an assumed utilisation (fp32 %.0f%%, tf32 %.0f%%, half %.0f%%, "
                "fp8 %.0f%%) of the dense peak of the %s (%s)",
                100 * assumed_mfu(metrics::MathRate::kFp32), 100 * assumed_mfu(metrics::MathRate::kTf32),
                100 * assumed_mfu(metrics::MathRate::kHalf), 100 * assumed_mfu(metrics::MathRate::kFp8),
                device_name.c_str(), peak_basis.c_str());
  return text;
}

std::string cpu_flops_basis() {
  char text[120];
  std::snprintf(text, sizeof(text), "from model FLOPs at an assumed %.0f GFLOP/s of the CPU", kCpuFlopsPerSecond / 1e9);
  return text;
}

DurationEstimate expected_duration(const std::vector<JobDuration>& jobs, int64_t jit_dtypes,
                                   const std::vector<JobDuration>& warm_up_jobs) {
  const auto start_of = [](const JobDuration& job) {
    double seconds = job.pytorch ? kPytorchStartSeconds : kPtrainStartSeconds;
    if (job.compiled) seconds += kCompileSeconds;
    if (job.estimate) seconds += kEstimateSeconds;
    if (job.multi_process) seconds += kLaunchSeconds;
    if (job.fp32_convolution_search) seconds += kFp32ConvolutionSearchSeconds;
    return seconds;
  };
  DurationEstimate e;
  for (const auto& job : jobs) {
    ++e.jobs;
    e.start_seconds += start_of(job);
    e.steps += job.steps;
    if (job.step_seconds) {
      e.step_seconds += static_cast<double>(job.steps) * *job.step_seconds;
      ++(job.measured ? e.measured : e.from_flops);
    } else {
      ++e.unknown;
    }
  }
  // A framework's warm-ups run side by side: each framework costs its slowest start.
  double ptrain_warm_up = 0.0, pytorch_warm_up = 0.0;
  for (const auto& job : warm_up_jobs) {
    double& slowest = job.pytorch ? pytorch_warm_up : ptrain_warm_up;
    slowest = std::max(slowest, start_of(job));
  }
  e.warm_up_seconds = ptrain_warm_up + pytorch_warm_up;
  e.jit_seconds = kJitSecondsPerDtype * static_cast<double>(jit_dtypes);
  e.seconds = e.start_seconds + e.step_seconds + e.jit_seconds + e.warm_up_seconds;
  return e;
}

std::string duration_line(const DurationEstimate& e, const std::string& flops_basis) {
  const auto whole = [](double seconds) { return std::to_string(static_cast<int64_t>(std::lround(seconds))); };
  char minutes[32];
  std::snprintf(minutes, sizeof(minutes), e.seconds < 600 ? "%.1f" : "%.0f", e.seconds / 60.0);
  std::string line = "expected: " + std::to_string(e.jobs) + (e.jobs == 1 ? " run" : " runs") + ", about " + minutes +
                     " minutes (" + whole(e.seconds) + " s): " + whole(e.start_seconds) +
                     " s of process starts (a run: ptrain " + whole(kPtrainStartSeconds) + " s, PyTorch " +
                     whole(kPytorchStartSeconds) + " s, torch.compile +" + whole(kCompileSeconds) +
                     " s, ptrain estimate +" + whole(kEstimateSeconds) + " s, a launch +" + whole(kLaunchSeconds) +
                     " s, cuDNN's search in a GPU fp32 run of convolutions +" + whole(kFp32ConvolutionSearchSeconds) +
                     " s)";
  if (e.warm_up_seconds > 0) line += ", " + whole(e.warm_up_seconds) + " s of warm-up runs";
  if (e.jit_seconds > 0) line += ", " + whole(e.jit_seconds) + " s of kernel JIT (" + whole(kJitSecondsPerDtype) +
                                 " s a dtype, once per machine)";
  line += ", " + whole(e.step_seconds) + " s of " + std::to_string(e.steps) + " steps (a step's time: ";
  std::string sources;
  const auto add = [&](int64_t n, const std::string& what) {
    if (n > 0) sources += (sources.empty() ? "" : ", ") + std::to_string(n) + " " + what;
  };
  add(e.measured, "from earlier records in --out");
  add(e.from_flops, flops_basis);
  add(e.unknown, "unknown, not counted");
  return line + (sources.empty() ? "none" : sources) + "); evaluation and data loading not counted";
}

}  // namespace ptrain::bench
