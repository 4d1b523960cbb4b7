// optimizer and scheduler: mapped only where ptrain's optimizer and schedule are the same (SGD, Adam in
// AdamW mode, AdamW; WarmupLR, WarmupDecayLR and WarmupCosineLR, which ptrain computes as DeepSpeed does), with
// DeepSpeed's defaults for what the file leaves out.
#include <algorithm>
#include <cctype>
#include <set>

#include "ptrain/config/deepspeed_sections.h"
#include "ptrain/core/error.h"

namespace ptrain::config::deepspeed {

namespace {

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char ch) { return std::tolower(ch); });
  return text;
}

struct TypeAndParams {
  std::string type;
  json params = json::object();
};

// {"type": ..., "params": {...}}, the shape of both blocks; section: "optimizer" or "scheduler".
TypeAndParams type_and_params(const KeyReader& k, const json& block, const std::string& section) {
  TypeAndParams out;
  for (const auto& [key, value] : block.items()) {
    if (key == "type") {
      check(value.is_string(), k.where(section + ".type") + " must be a name");
      out.type = value.get<std::string>();
    } else if (key == "params") {
      out.params = k.object(value, section + ".params");
    } else {
      throw Error(k.where(section + "." + key) + " is not " + (section == "optimizer" ? "an" : "a") + " " + section +
                  " setting (type, params)");
    }
  }
  return out;
}

// The optimizer the run trains with: a flag's, else the file's, else ptrain's default.
std::string final_optimizer(const Reading& r) {
  if (r.given.count("optimizer") == 0 && r.overlay.optimizer) return r.overlay.optimizer->value;
  return r.before.optim.name;
}

// A learning rate given as "auto" takes --lr. Where no --lr (flag, PTRAIN_LR, --config) and no rate of the file
// gives one, ptrain's default is SGD's (0.1): under Adam or AdamW there is nothing an "auto" could mean.
void auto_learning_rate(Reading& r, const std::string& key) {
  const bool from_file = r.overlay.lr && r.overlay.lr->named_by_file;
  check(final_optimizer(r) == "sgd" || r.given.count("lr") > 0 || from_file,
        r.keys.where(key) + " is \"auto\", which takes --lr, and no --lr is given (ptrain's default, 0.1, is SGD's "
                            "rate, not " + final_optimizer(r) + "'s): give --lr, or a rate in the file");
  r.overlay.auto_keys.push_back({key, "lr", ""});
}

// The defaults of the optimizer DeepSpeed builds, for the parameters the file leaves out.
void optimizer_defaults(Reading& r, const json& params, bool sgd, bool torch_adam) {
  const KeyReader& k = r.keys;
  ConfigOverlay& o = r.overlay;
  const auto missing = [&](const char* key) { return !params.contains(key); };
  if (sgd) {
    check(!missing("lr"), k.where("optimizer.params.lr") + " is required for SGD");
    if (missing("momentum")) o.momentum = {0.0, "optimizer.params.momentum", false};
    if (missing("weight_decay")) o.weight_decay = {0.0, "optimizer.params.weight_decay", false};
    if (missing("nesterov")) o.nesterov = {false, "optimizer.params.nesterov", false};
  } else {
    if (missing("lr")) o.lr = {0.001, "optimizer.params.lr", false};
    if (missing("betas")) {
      o.beta1 = {0.9, "optimizer.params.betas", false};
      o.beta2 = {0.999, "optimizer.params.betas", false};
    }
    if (missing("eps")) o.eps = {1e-08, "optimizer.params.eps", false};
    // FusedAdam and DeepSpeedCPUAdam default to no weight decay; torch.optim.AdamW to 0.01.
    if (missing("weight_decay")) o.weight_decay = {torch_adam ? 0.01 : 0.0, "optimizer.params.weight_decay", false};
  }
}

}  // namespace

void read_optimizer(Reading& r, const json& block) {
  const KeyReader& k = r.keys;
  ConfigOverlay& o = r.overlay;
  const TypeAndParams read = type_and_params(k, block, "optimizer");
  const std::string& type = read.type;
  const json& params = read.params;
  const std::string name = lower(type);
  check(name == "sgd" || name == "adam" || name == "adamw",
        k.where("optimizer.type") + ": '" + type + "' has no ptrain equivalent (supported: SGD, Adam, AdamW)");
  const bool sgd = name == "sgd";
  o.optimizer = {sgd ? "sgd" : "adamw", "optimizer.type"};
  bool torch_adam = false, adam_w_mode = true;
  for (const auto& [key, value] : params.items()) {
    const std::string full = "optimizer.params." + key;
    if (is_auto(value)) {  // ptrain's value, as the Hugging Face Trainer fills its own in
      if (key == "lr") {
        auto_learning_rate(r, full);
      } else if (key == "betas") {
        o.auto_keys.push_back({full, "beta1", ""});
        o.auto_keys.push_back({full, "beta2", ""});
      } else if (key == "weight_decay" || key == "eps" || key == "momentum" || key == "nesterov") {
        o.auto_keys.push_back({full, key == "weight_decay" ? "weight-decay" : key, ""});
      } else {
        throw Error(k.where(full) + " is \"auto\", and ptrain has no setting to take it from: give a value or "
                                    "leave the key out");
      }
      continue;
    }
    if (key == "lr") {
      o.lr = {k.non_negative(value, full), full};
    } else if (key == "weight_decay") {
      o.weight_decay = {k.non_negative(value, full), full};
    } else if (!sgd && key == "betas") {
      check(value.is_array() && value.size() == 2, k.where(full) + " must be a list of two numbers");
      o.beta1 = {k.number(value[0], full), full};
      o.beta2 = {k.number(value[1], full), full};
    } else if (!sgd && key == "eps") {
      o.eps = {k.non_negative(value, full), full};
    } else if (!sgd && key == "adam_w_mode") {
      adam_w_mode = k.boolean(value, full);
    } else if (!sgd && key == "torch_adam") {
      torch_adam = k.boolean(value, full);
    } else if (!sgd && (key == "bias_correction")) {
      check(k.boolean(value, full), k.where(full) + ": Adam without bias correction is not supported");
    } else if (!sgd && key == "amsgrad") {
      check(!k.boolean(value, full), k.where(full) + ": AMSGrad is not supported");
    } else if (sgd && key == "momentum") {
      o.momentum = {k.non_negative(value, full), full};
    } else if (sgd && key == "nesterov") {
      o.nesterov = {k.boolean(value, full), full};
    } else if (sgd && key == "dampening") {
      check(k.number(value, full) == 0.0, k.where(full) + ": SGD dampening is not supported");
    } else {
      throw Error(k.where(full) + " is not a " + type + " parameter ptrain knows");
    }
  }
  // DeepSpeed's Adam is AdamW unless adam_w_mode is false (the type AdamW always is).
  check(name == "adamw" || sgd || adam_w_mode,
        k.where("optimizer.params.adam_w_mode") + ": Adam with L2 regularisation (adam_w_mode false) is not "
                                                  "supported; ptrain's adamw decouples weight decay");
  optimizer_defaults(r, params, sgd, torch_adam);
}

// The three schedulers become ptrain's schedules of the same names, which give every optimizer step the rate
// DeepSpeed's scheduler gives it (train/schedule.cpp), with DeepSpeed's defaults for the parameters the file leaves
// out (deepspeed/runtime/lr_schedules.py: warmup_num_steps 1000, warmup_type log, warmup_min_lr and
// warmup_min_ratio 0, cos_min_ratio 0.0001; WarmupDecayLR's warmup_max_lr 0.001, WarmupLR's the optimizer's lr).
void read_scheduler(Reading& r, const json& block) {
  const KeyReader& k = r.keys;
  ConfigOverlay& o = r.overlay;
  const TypeAndParams read = type_and_params(k, block, "scheduler");
  const std::string& type = read.type;
  const json& params = read.params;
  check(type == "WarmupLR" || type == "WarmupDecayLR" || type == "WarmupCosineLR",
        k.where("scheduler.type") + ": '" + type +
            "' has no ptrain equivalent (supported: WarmupLR, WarmupDecayLR, WarmupCosineLR)");
  const bool cosine = type == "WarmupCosineLR";
  const bool decay = type == "WarmupDecayLR";
  const auto value_of = [&](const char* key) -> const json* {
    return params.contains(key) && !is_auto(params.at(key)) ? &params.at(key) : nullptr;
  };
  static const std::set<std::string> warmup_lr = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps",
                                                  "warmup_type", "last_batch_iteration"};
  static const std::set<std::string> warmup_cosine = {"total_num_steps", "warmup_min_ratio", "warmup_num_steps",
                                                      "cos_min_ratio", "warmup_type", "last_batch_iteration"};
  for (const auto& [key, value] : params.items()) {
    check((cosine ? warmup_cosine : warmup_lr).count(key) > 0 || (decay && key == "total_num_steps"),
          k.where("scheduler.params." + key) + " is not a " + type + " parameter ptrain knows");
  }
  if (const json* v = value_of("last_batch_iteration"))
    check(k.integer(*v, "scheduler.params.last_batch_iteration") == -1,
          k.where("scheduler.params.last_batch_iteration") + ": resuming a schedule this way is not supported "
                                                             "(ptrain resumes from its checkpoints)");
  for (const auto& [key, value] : params.items()) {
    if (!is_auto(value)) continue;
    const std::string full = "scheduler.params." + key;
    if (key == "warmup_max_lr") {
      auto_learning_rate(r, full);
    } else if (key == "warmup_num_steps") {
      o.auto_keys.push_back({full, "warmup-steps", ""});
    } else if (key == "total_num_steps") {
      o.auto_keys.push_back({full, "max-steps", ""});
    } else if (key == "warmup_min_lr") {
      o.auto_keys.push_back({full, "warmup-min-lr", ""});
    } else if (key == "warmup_min_ratio") {
      o.auto_keys.push_back({full, "", "0 (DeepSpeed's default; --warmup-min-lr wins)"});
    } else if (key == "cos_min_ratio") {
      o.auto_keys.push_back({full, "", "0.0001 (DeepSpeed's default; --min-lr wins)"});
    } else if (key == "warmup_type") {
      o.auto_keys.push_back({full, "warmup-type", ""});
    } else if (key == "last_batch_iteration") {
      o.auto_keys.push_back({full, "", "-1 (a fresh schedule)"});
    }
  }
  o.schedule = {type, "scheduler.type"};

  if (const json* v = value_of("warmup_type")) {
    // DeepSpeed falls back to log on a name it does not know, with a warning in its log: a misspelt "linear"
    // would silently warm up otherwise than the file means, so it is an error here.
    check(v->is_string() && (v->get<std::string>() == "log" || v->get<std::string>() == "linear"),
          k.where("scheduler.params.warmup_type") + " must be log or linear, not " + v->dump());
    o.warmup_type = {v->get<std::string>(), "scheduler.params.warmup_type"};
  } else if (!params.contains("warmup_type")) {
    o.warmup_type = {"log", "scheduler.params.warmup_type", false};
  }

  // warmup_num_steps is ptrain's --warmup-steps, in steps rather than --warmup-epochs, whatever those say.
  if (const json* v = value_of("warmup_num_steps")) {
    const int64_t steps = k.integer(*v, "scheduler.params.warmup_num_steps");
    check(steps >= 0, k.where("scheduler.params.warmup_num_steps") + " must not be negative");
    o.warmup_steps = {steps, "scheduler.params.warmup_num_steps"};
    if (steps < 2)
      k.note(k.where("scheduler.params.warmup_num_steps") + " is " + std::to_string(steps) +
             ": DeepSpeed warms up over max(2, warmup_num_steps) = 2 steps, and so does ptrain");
  } else if (!params.contains("warmup_num_steps")) {
    o.warmup_steps = {1000, "scheduler.params.warmup_num_steps", false};
  }
  o.warmup_epochs = {0.0, "scheduler.params.warmup_num_steps", false};

  if (!cosine) {
    if (const json* v = value_of("warmup_min_lr"))
      o.warmup_min_lr = {k.non_negative(*v, "scheduler.params.warmup_min_lr"), "scheduler.params.warmup_min_lr"};
    else if (!params.contains("warmup_min_lr"))
      o.warmup_min_lr = {0.0, "scheduler.params.warmup_min_lr", false};
    // The scheduler's peak rate replaces the optimizer's lr, as in DeepSpeed; WarmupLR without one keeps the
    // optimizer's.
    if (const json* v = value_of("warmup_max_lr"))
      o.lr = {k.non_negative(*v, "scheduler.params.warmup_max_lr"), "scheduler.params.warmup_max_lr"};
    else if (decay && !params.contains("warmup_max_lr"))
      o.lr = {0.001, "scheduler.params.warmup_max_lr", false};
  } else {
    double warmup_min_ratio = 0.0;
    if (const json* v = value_of("warmup_min_ratio"))
      warmup_min_ratio = k.non_negative(*v, "scheduler.params.warmup_min_ratio");
    check(warmup_min_ratio <= 1.0, k.where("scheduler.params.warmup_min_ratio") + " must not exceed 1");
    o.warmup_min_ratio = warmup_min_ratio;
    double cos_min_ratio = 0.0001;
    if (const json* v = value_of("cos_min_ratio")) cos_min_ratio = k.non_negative(*v, "scheduler.params.cos_min_ratio");
    check(cos_min_ratio <= 1.0, k.where("scheduler.params.cos_min_ratio") + " must not exceed 1");
    o.min_lr_ratio = cos_min_ratio;
  }
  if (type == "WarmupLR") return;
  // DeepSpeed's decay spans total_num_steps; ptrain's spans the run, so the one becomes the other.
  if (const json* v = value_of("total_num_steps")) {
    const int64_t total = k.positive_integer(*v, "scheduler.params.total_num_steps");
    o.max_steps = {total, "scheduler.params.total_num_steps"};
    k.note(k.where("scheduler.params.total_num_steps") + " becomes --max-steps " + std::to_string(total) +
           ": the run trains that many steps, over the epochs they take (--max-steps overrides --epochs), and its "
           "decay spans them");
  } else {
    check(params.contains("total_num_steps"), k.where("scheduler.params.total_num_steps") + " is required for " + type);
  }
}

}  // namespace ptrain::config::deepspeed
