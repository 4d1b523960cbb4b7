#include "ptrain/train/checkpoint.h"

#include <filesystem>
#include <map>
#include <regex>

#include "ptrain/core/error.h"
#include "ptrain/io/safetensors.h"

namespace ptrain::train {

namespace fs = std::filesystem;

namespace {
constexpr const char* kFormat = "ptrain-checkpoint";
constexpr const char* kVersion = "1";
const std::vector<std::string> kSections = {"model", "optimizer", "scaler", "progress"};

// Works for const and mutable checkpoints alike.
template <class C>
auto section_of(C& c, const std::string& name) -> decltype(&c.model) {
  if (name == "model") return &c.model;
  if (name == "optimizer") return &c.optimizer;
  if (name == "scaler") return &c.scaler;
  if (name == "progress") return &c.progress;
  return nullptr;
}

int64_t metadata_int(const std::map<std::string, std::string>& meta, const std::string& key, const std::string& path) {
  auto it = meta.find(key);
  check(it != meta.end(), path + ": checkpoint metadata lacks '" + key + "'");
  try {
    return std::stoll(it->second);
  } catch (const std::exception&) {
    throw Error(path + ": checkpoint metadata '" + key + "' is not an integer: " + it->second);
  }
}
// Reads every rank's shard file of the checkpoint at path and adds the full tensors they make up to c:
// parameters by their model names, optimizer slots as "<parameter>.<slot>" (what a one-process run
// saves). Hybrid sharding's replicas hold the same shards: the first one found serves.
void assemble_shards(const std::string& path, Checkpoint& c) {
  struct Group {
    nlohmann::json layout;
    std::map<int64_t, torch::Tensor> params;                        // shard index -> shard
    std::map<std::string, std::map<int64_t, torch::Tensor>> slots;  // slot -> shard index -> shard
  };
  std::map<std::string, Group> groups;
  std::vector<std::string> order;
  for (int64_t r = 0; r < c.shards; ++r) {
    const std::string file = shard_path(path, r);
    check(fs::is_regular_file(file), path + ": its shard " + file + " is missing (the checkpoint has " +
                                         std::to_string(c.shards) + " shard files)");
    std::map<std::string, std::string> meta;
    auto tensors = io::read_safetensors(file, &meta);
    check(meta["format"] == std::string(kFormat) + "-shard", file + ": not a ptrain checkpoint shard");
    nlohmann::json layout;
    try {
      layout = nlohmann::json::parse(meta["layout"]);
    } catch (const nlohmann::json::exception& e) {
      throw Error(file + ": shard metadata 'layout' is not JSON: " + e.what());
    }
    std::map<std::string, int64_t> index_of;
    for (const auto& g : layout) {
      const std::string key = g.at("key");
      if (!groups.count(key)) {
        groups[key].layout = g;
        order.push_back(key);
      }
      index_of[key] = g.at("shard_index").get<int64_t>();
    }
    for (auto& [name, tensor] : tensors) {
      if (index_of.count(name)) {
        groups[name].params.emplace(index_of[name], tensor);
        continue;
      }
      const auto dot = name.rfind('.');
      const std::string group = dot == std::string::npos ? "" : name.substr(0, dot);
      if (index_of.count(group)) {
        groups[group].slots[name.substr(dot + 1)].emplace(index_of[group], tensor);
      } else if (r == 0) {
        c.optimizer.emplace_back(name, tensor);  // not sharded (e.g. Adam's step count)
      }
    }
  }
  // The padded flat tensor of a group from its shards, cut into the group's parameters.
  const auto split = [&](const std::string& key, const std::map<int64_t, torch::Tensor>& shards, const std::string& what,
                         const std::string& suffix, io::NamedTensors& out) {
    const auto& layout = groups[key].layout;
    const int64_t count = layout.at("shard_count");
    std::vector<torch::Tensor> parts;
    for (int64_t i = 0; i < count; ++i) {
      auto it = shards.find(i);
      check(it != shards.end(), path + ": shard " + std::to_string(i) + " of " + what + " '" + key + "' is in no shard file");
      parts.push_back(it->second.reshape({-1}));
    }
    const auto flat = torch::cat(parts);
    for (const auto& p : layout.at("params")) {
      const auto shape = p.at("shape").get<std::vector<int64_t>>();
      int64_t numel = 1;
      for (const auto d : shape) numel *= d;
      out.emplace_back(p.at("name").get<std::string>() + suffix,
                       flat.narrow(0, p.at("offset").get<int64_t>(), numel).view(shape).clone());
    }
  };
  for (const auto& key : order) {
    split(key, groups[key].params, "parameters", "", c.model);
    for (const auto& [slot, shards] : groups[key].slots) split(key, shards, "optimizer state", "." + slot, c.optimizer);
  }
}

}  // namespace

void save_checkpoint(const std::string& path, const Checkpoint& c) {
  io::NamedTensors all;
  for (const auto& section : kSections) {
    for (const auto& [name, tensor] : *section_of(c, section)) all.emplace_back(section + "/" + name, tensor);
  }
  std::map<std::string, std::string> meta = {
      {"format", kFormat},
      {"format_version", kVersion},
      {"epoch", std::to_string(c.position.epoch)},
      {"micro_batch", std::to_string(c.position.micro_batch)},
      {"global_step", std::to_string(c.position.global_step)},
      {"world_size", std::to_string(c.position.world_size)},
      {"batch_size", std::to_string(c.position.batch_size)},
      {"run", c.run.dump()},
  };
  if (c.shards > 0) meta["shards"] = std::to_string(c.shards);
  fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) fs::create_directories(parent);
  io::write_safetensors(path, all, meta);
}

Checkpoint load_checkpoint(const std::string& path) {
  std::map<std::string, std::string> meta;
  io::NamedTensors all = io::read_safetensors(path, &meta);
  auto format = meta.find("format");
  check(format != meta.end() && format->second == kFormat,
        path + ": not a ptrain checkpoint (a weights file? use --weights for those)");
  check(meta["format_version"] == kVersion,
        path + ": checkpoint format version " + meta["format_version"] + " is not supported (expected " + kVersion + ")");
  Checkpoint c;
  c.position.epoch = metadata_int(meta, "epoch", path);
  c.position.micro_batch = metadata_int(meta, "micro_batch", path);
  c.position.global_step = metadata_int(meta, "global_step", path);
  c.position.world_size = metadata_int(meta, "world_size", path);
  c.position.batch_size = metadata_int(meta, "batch_size", path);
  try {
    c.run = nlohmann::json::parse(meta["run"]);
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": checkpoint metadata 'run' is not JSON: " + e.what());
  }
  for (auto& [name, tensor] : all) {
    auto slash = name.find('/');
    io::NamedTensors* section = slash == std::string::npos ? nullptr : section_of(c, name.substr(0, slash));
    check(section != nullptr, path + ": unexpected tensor '" + name + "' in checkpoint");
    section->emplace_back(name.substr(slash + 1), tensor);
  }
  if (meta.count("shards")) {
    c.shards = metadata_int(meta, "shards", path);
    assemble_shards(path, c);
  }
  check(!c.model.empty(), path + ": checkpoint holds no model weights");
  return c;
}

std::string shard_path(const std::string& path, int64_t rank) {
  fs::path p(path);
  char suffix[32];
  std::snprintf(suffix, sizeof(suffix), ".rank-%05lld", static_cast<long long>(rank));
  return (p.parent_path() / (p.stem().string() + suffix + p.extension().string())).string();
}

void save_shard(const std::string& path, int64_t rank, int64_t ranks, const io::NamedTensors& shards,
                const nlohmann::json& layout) {
  fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) fs::create_directories(parent);
  io::write_safetensors(shard_path(path, rank), shards,
                        {{"format", std::string(kFormat) + "-shard"},
                         {"rank", std::to_string(rank)},
                         {"ranks", std::to_string(ranks)},
                         {"layout", layout.dump()}});
}

std::string checkpoint_path(const std::string& dir, int64_t global_step) {
  char name[64];
  std::snprintf(name, sizeof(name), "step-%08lld.safetensors", static_cast<long long>(global_step));
  return (fs::path(dir) / name).string();
}

std::string latest_checkpoint(const std::string& dir) {
  if (!fs::is_directory(dir)) return {};
  static const std::regex pattern(R"(step-(\d+)\.safetensors)");
  std::string best;
  long long best_step = -1;
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::smatch m;
    const std::string file = entry.path().filename().string();
    if (std::regex_match(file, m, pattern) && std::stoll(m[1]) > best_step) {
      best_step = std::stoll(m[1]);
      best = entry.path().string();
    }
  }
  return best;
}

}  // namespace ptrain::train
