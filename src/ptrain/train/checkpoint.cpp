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
  check(!c.model.empty(), path + ": checkpoint holds no model weights");
  return c;
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
