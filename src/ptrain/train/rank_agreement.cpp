#include "ptrain/train/rank_agreement.h"

#include <algorithm>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "ptrain/config/cli_options.h"
#include "ptrain/core/error.h"
#include "ptrain/core/torch_compat.h"
#include "ptrain/precision/policy.h"

namespace ptrain::train {

namespace {

// Settings each process may hold for itself: the device index (cuda:<local rank>), CPU threads (per
// node), how progress shows, a collective's patience, and outputs that only rank 0 writes or that each
// rank writes for itself. --resume is compared as the checkpoint it resolved to.
const std::set<std::string>& per_process_keys() {
  static const std::set<std::string> keys{"run.device",        "run.threads",        "run.progress",   "run.log_all_ranks",
                                          "run.metrics_out",   "run.profile_out",    "run.resume",
                                          "run.tensorboard",   "run.log_jsonl",
                                          "run.deepspeed_config", "data.loader_threads", "data.prefetch",
                                          "dist.timeout_seconds"};
  return keys;
}

void flatten_settings(const nlohmann::json& node, const std::string& prefix, Settings& out) {
  if (node.is_object()) {
    for (auto it = node.begin(); it != node.end(); ++it)
      flatten_settings(it.value(), prefix.empty() ? it.key() : prefix + "." + it.key(), out);
    return;
  }
  if (per_process_keys().count(prefix) == 0) out.emplace_back(prefix, node.dump());
}

std::string policy_text(const precision::PrecisionPolicy& p) {
  return p.name + ": parameters " + precision::dtype_name(p.param_dtype) + ", compute " +
         precision::dtype_name(p.compute_dtype) + ", gradients reduced in " + precision::dtype_name(p.reduce_dtype) +
         (p.master_weights ? ", " + precision::dtype_name(p.master_dtype) + " masters" : "") +
         (p.autocast ? ", autocast to " + precision::dtype_name(p.autocast_dtype) : "") +
         (p.loss_scaling ? ", loss scaling" : "");
}

std::string ranks_text(const std::vector<size_t>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) text += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
  return text;
}

std::string value_on(const Settings& settings, const std::string& key) {
  for (const auto& [name, value] : settings)
    if (name == key) return value;
  return "(not set: another ptrain version?)";
}

nlohmann::json settings_json(const Settings& settings) {
  nlohmann::json pairs = nlohmann::json::array();
  for (const auto& [key, value] : settings) pairs.push_back({key, value});
  return pairs;
}

Settings settings_from_json(const std::string& text, size_t rank) {
  Settings settings;
  try {
    for (const auto& pair : nlohmann::json::parse(text))
      settings.emplace_back(pair.at(0).get<std::string>(), pair.at(1).get<std::string>());
  } catch (const nlohmann::json::exception& e) {
    throw Error("rank " + std::to_string(rank) + " sent settings this rank cannot read (another ptrain version?): " +
                e.what());
  }
  return settings;
}

}  // namespace

Settings settings_to_agree(const Plan& plan) {
  Settings settings;
  flatten_settings(plan.settings, "", settings);
  settings.emplace_back("device type", plan.device.is_cuda() ? "cuda" : plan.device.str());
  settings.emplace_back("strategy and sharding", plan.strategy.name());
  settings.emplace_back("precision policy", policy_text(plan.precision));
  settings.emplace_back("resumed checkpoint", plan.resume_path.empty() ? "none" : plan.resume_path);
  settings.emplace_back("world size", std::to_string(plan.launch.world_size));
  settings.emplace_back("ptrain version", PTRAIN_VERSION);
  settings.emplace_back("LibTorch version", compat::torch_version());
  return settings;
}

std::string flag_of_setting(const std::string& key) {
  static const std::map<std::string, std::string> named_otherwise{
      {"model.name", "--model"}, {"optimizer.name", "--optimizer"}, {"data.path", "--data-path"},
      {"dist.timeout_seconds", "--dist-timeout"}};
  if (const auto it = named_otherwise.find(key); it != named_otherwise.end()) return it->second;
  const auto dot = key.rfind('.');
  if (dot == std::string::npos || key.find(' ') != std::string::npos) return "";
  std::string flag = "--" + key.substr(dot + 1);
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

std::string first_disagreement(const std::vector<Settings>& per_rank) {
  if (per_rank.size() < 2) return "";
  for (const auto& [key, ignored] : per_rank.front()) {
    // Each value with the ranks holding it, in the order of the lowest rank holding it.
    std::vector<std::pair<std::string, std::vector<size_t>>> values;
    for (size_t r = 0; r < per_rank.size(); ++r) {
      const std::string value = value_on(per_rank[r], key);
      auto it = std::find_if(values.begin(), values.end(), [&](const auto& v) { return v.first == value; });
      if (it == values.end()) {
        values.push_back({value, {r}});
      } else {
        it->second.push_back(r);
      }
    }
    if (values.size() == 1) continue;
    std::string text = "ranks disagree on " + key;
    const std::string flag = flag_of_setting(key);
    if (!flag.empty()) text += " (" + flag + ")";
    text += ":";
    for (size_t i = 0; i < values.size(); ++i)
      text += (i == 0 ? " " : "; ") + values[i].first + " on " + ranks_text(values[i].second);
    text += flag.empty() ? ". Every rank must train the same run: start each with the same flags, config files and "
                           "PTRAIN_* variables, and the same ptrain"
                         : ". Every rank must train the same run: check " + flag + ", " +
                               config::env_name_of(flag.substr(2)) + " and the config files on every node";
    return text;
  }
  return "";
}

void check_ranks_agree(const Plan& plan, strategies::Strategy& strategy) {
  if (strategy.world_size() < 2) return;
  const auto texts = strategy.all_gather_text("settings", settings_json(settings_to_agree(plan)).dump());
  std::vector<Settings> per_rank;
  for (size_t r = 0; r < texts.size(); ++r) per_rank.push_back(settings_from_json(texts[r], r));
  const std::string disagreement = first_disagreement(per_rank);
  check(disagreement.empty(), disagreement);
}

}  // namespace ptrain::train
