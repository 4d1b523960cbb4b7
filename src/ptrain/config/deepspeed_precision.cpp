// DeepSpeed's fp16 and bf16 blocks keep the model in half precision and an fp32 copy in the optimizer;
// torch_autocast is autocast over fp32 weights. Loss scaling follows DeepSpeed's rules.
#include <cmath>
#include <functional>

#include "ptrain/config/deepspeed_sections.h"
#include "ptrain/config/number_checks.h"
#include "ptrain/core/error.h"

namespace ptrain::config::deepspeed {

namespace {

// A block's "enabled"; "auto" is whatever ptrain is asked to run: does that mode train in this block's
// half dtype (fp16, bf16), or autocast (torch_autocast)?
bool enabled(Reading& r, const json& block, const std::string& key,
             const std::function<bool(precision::PrecisionMode)>& auto_means) {
  if (block.is_null() || !block.contains("enabled")) return false;
  const json& value = block.at("enabled");
  if (is_auto(value)) {
    r.overlay.auto_keys.push_back({key + ".enabled", "precision", ""});
    return auto_means(precision::mode_named(r.before.precision.precision));
  }
  return r.keys.boolean(value, key + ".enabled");
}

bool is_explicit_true(const json& block) { return block.at("enabled") == json(true); }

// The model in half precision, fp32 master weights in the optimizer. A --precision given elsewhere
// wins, and master weights only go with the pure half modes.
void set_half_precision(Reading& r, c10::ScalarType half, const std::string& key) {
  r.overlay.precision = {precision::to_string(precision::half_mode(half, /*autocast=*/false)), key};
  if (precision::half_parameters(r.final_mode())) r.overlay.master_weights = {true, key};
}

void read_bf16(Reading& r, const json& bf16, const std::string& bf16_key, bool on) {
  const KeyReader& k = r.keys;
  for (const auto& [key, value] : bf16.items()) {
    const std::string full = bf16_key + "." + key;
    if (key == "enabled") continue;
    if (key == "immediate_grad_update" || key == "check_grad_overflow") {
      k.warn(full, "tunes DeepSpeed's bf16 optimizer wrapper only");
    } else if (key == "bf16_master_weights_and_grads" || key == "bf16_optimizer_states") {
      check(!k.boolean(value, full), k.where(full) + ": ptrain keeps fp32 master weights and optimizer state");
    } else {
      throw Error(k.where(full) + " is not a bf16 setting ptrain knows");
    }
  }
  if (on && is_explicit_true(bf16)) set_half_precision(r, c10::ScalarType::BFloat16, bf16_key + ".enabled");
}

void read_autocast(Reading& r, const json& autocast, bool on) {
  const KeyReader& k = r.keys;
  std::string dtype = "bfloat16";
  for (const auto& [key, value] : autocast.items()) {
    const std::string full = "torch_autocast." + key;
    if (key == "enabled") continue;
    if (key == "dtype") {
      check(value.is_string(), k.where(full) + " must be a dtype name");
      dtype = value.get<std::string>();
      if (dtype.rfind("torch.", 0) == 0) dtype = dtype.substr(6);
      check(dtype == "bfloat16" || dtype == "float16",
            k.where(full) + ": '" + value.get<std::string>() + "' (supported: bfloat16, float16)");
    } else {
      throw Error(k.where(full) + " is not a torch_autocast setting ptrain supports (autocast follows "
                                  "torch.autocast's own op lists)");
    }
  }
  if (on && is_explicit_true(autocast)) {
    const auto half = dtype == "bfloat16" ? c10::ScalarType::BFloat16 : c10::ScalarType::Half;
    r.overlay.precision = {precision::to_string(precision::half_mode(half, /*autocast=*/true)),
                           "torch_autocast.enabled"};
  }
}

void read_fp16(Reading& r, const json& fp16, bool on) {
  const KeyReader& k = r.keys;
  ConfigOverlay& o = r.overlay;
  if (on && is_explicit_true(fp16)) set_half_precision(r, c10::ScalarType::Half, "fp16.enabled");
  // DeepSpeed's defaults for the keys the file leaves out.
  double loss_scale = 0;
  int64_t initial_scale_power = 16, window = 1000, hysteresis = 2;
  double min_loss_scale = 1;
  bool consecutive = false;
  std::vector<std::string> dynamic_keys;
  for (const auto& [key, value] : fp16.items()) {
    const std::string full = "fp16." + key;
    if (key == "enabled") continue;
    if (is_auto(value)) continue;  // ptrain's value (DeepSpeed's default where ptrain has none)
    if (key == "loss_scale") {
      loss_scale = k.non_negative(value, full);
    } else if (key == "initial_scale_power") {
      initial_scale_power = k.integer(value, full);
      check(initial_scale_power >= 0 && initial_scale_power <= 127, k.where(full) + " must be in 0..127");
      dynamic_keys.push_back(full);
    } else if (key == "loss_scale_window") {
      window = k.positive_integer(value, full);
      dynamic_keys.push_back(full);
    } else if (key == "hysteresis") {
      hysteresis = k.positive_integer(value, full);
      dynamic_keys.push_back(full);
    } else if (key == "consecutive_hysteresis") {
      consecutive = k.boolean(value, full);
      dynamic_keys.push_back(full);
    } else if (key == "min_loss_scale") {
      min_loss_scale = k.non_negative(value, full);
      dynamic_keys.push_back(full);
    } else if (key == "auto_cast") {
      k.warn(full, "is not needed: ptrain feeds the model its inputs in the compute dtype");
    } else if (key == "fp16_master_weights_and_grads") {
      check(!k.boolean(value, full), k.where(full) + ": ptrain keeps fp32 master weights and gradients");
    } else {
      throw Error(k.where(full) + " is not an fp16 setting ptrain knows (enabled, loss_scale, initial_scale_power, "
                                  "loss_scale_window, hysteresis, consecutive_hysteresis, min_loss_scale)");
    }
  }
  const bool uses_fp16 = on && precision::half_dtype(r.final_mode()) == c10::ScalarType::Half;
  if (!uses_fp16) {
    if (!dynamic_keys.empty() || loss_scale > 0)
      k.note(k.path() + ": the fp16 loss-scaling keys have no effect: precision is " + r.final_precision());
    return;
  }
  if (loss_scale > 0) {
    o.loss_scale = {exact_number_text(loss_scale), "fp16.loss_scale"};
    for (const auto& key : dynamic_keys) k.warn(key, "applies to dynamic loss scaling, and loss_scale sets a static one");
    return;
  }
  const auto has = [&](const char* key) { return fp16.contains(key) && !is_auto(fp16.at(key)); };
  o.loss_scale = {"dynamic", "fp16.loss_scale", has("loss_scale")};
  o.initial_loss_scale = {std::ldexp(1.0, static_cast<int>(initial_scale_power)), "fp16.initial_scale_power",
                          has("initial_scale_power")};
  o.loss_scale_window = {window, "fp16.loss_scale_window", has("loss_scale_window")};
  o.hysteresis = {hysteresis, "fp16.hysteresis", has("hysteresis")};
  o.consecutive_hysteresis = {consecutive, "fp16.consecutive_hysteresis", has("consecutive_hysteresis")};
  o.min_loss_scale = {min_loss_scale, "fp16.min_loss_scale", has("min_loss_scale")};
}

}  // namespace

std::string Reading::final_precision() const {
  if (given.count("precision") > 0) return before.precision.precision;
  return overlay.precision ? overlay.precision->value : before.precision.precision;
}

void read_precision(Reading& r, const PrecisionBlocks& b) {
  const auto trains_in = [](c10::ScalarType half) {
    return [half](precision::PrecisionMode mode) { return precision::half_dtype(mode) == half; };
  };
  const bool fp16_on = enabled(r, b.fp16, "fp16", trains_in(c10::ScalarType::Half));
  const bool bf16_on = enabled(r, b.bf16, b.bf16_key, trains_in(c10::ScalarType::BFloat16));
  const bool autocast_on = enabled(r, b.autocast, "torch_autocast", precision::autocasts);
  const std::string& path = r.keys.path();
  check(!(fp16_on && bf16_on), path + ": fp16 and " + b.bf16_key + " are both enabled; enable one");
  check(!(autocast_on && (fp16_on || bf16_on)),
        path + ": torch_autocast together with fp16 or bf16 is not supported; enable one");
  if (!b.bf16.is_null()) read_bf16(r, b.bf16, b.bf16_key, bf16_on);
  if (!b.autocast.is_null()) read_autocast(r, b.autocast, autocast_on);
  if (!b.fp16.is_null()) read_fp16(r, b.fp16, fp16_on);
}

}  // namespace ptrain::config::deepspeed
