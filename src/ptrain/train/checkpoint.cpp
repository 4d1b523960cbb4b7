#include "ptrain/train/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <regex>
#include <thread>

#include <zlib.h>

#include "ptrain/core/error.h"
#include "ptrain/io/chunks.h"
#include "ptrain/io/safetensors.h"

namespace ptrain::train {

namespace fs = std::filesystem;

namespace {
constexpr const char* kFormat = "ptrain-checkpoint";
// 2: every file carries a checksum of its contents. Version 1 files (without) still load.
constexpr const char* kVersion = "2";
constexpr const char* kUnchecksummedVersion = "1";

// Corruption that leaves a well-formed file (a flipped bit in a tensor) shows only in the checksum.
void require_checksum(const std::map<std::string, std::string>& meta, const std::string& path) {
  check(meta.count("ptrain_checksum") > 0,
        path + ": checkpoint lacks its checksum (format version 2 has one): the file is corrupt");
}
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
    if (c.format_version != kUnchecksummedVersion) require_checksum(meta, file);
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

nlohmann::json lineage_json(const Lineage& l) {
  nlohmann::json parent = nullptr;
  if (l.parent_step >= 0) parent = {{"run_id", l.parent_run_id}, {"step", l.parent_step}, {"file", l.parent_file}};
  return {{"run_id", l.run_id}, {"sequence", l.sequence}, {"parent", parent}};
}

// The lineage in meta; none (run_id empty) in a checkpoint written before lineage was recorded.
Lineage lineage_of(const std::map<std::string, std::string>& meta, const std::string& path) {
  Lineage l;
  const auto it = meta.find("lineage");
  if (it == meta.end()) return l;
  try {
    const auto j = nlohmann::json::parse(it->second);
    l.run_id = j.at("run_id").get<std::string>();
    l.sequence = j.at("sequence").get<int64_t>();
    const auto& parent = j.at("parent");
    if (!parent.is_null()) {
      l.parent_run_id = parent.at("run_id").get<std::string>();
      l.parent_step = parent.at("step").get<int64_t>();
      l.parent_file = parent.value("file", "");
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": checkpoint metadata 'lineage' is malformed: " + e.what());
  }
  return l;
}

constexpr const char* kPartFormatSuffix = "-part";

struct ListedPart {
  std::string file;      // the part's name, beside the checkpoint
  std::string checksum;  // its "ptrain_checksum", which binds it to the checkpoint that lists it
};

// The part files a checkpoint's metadata names, in order. A name that is not a part file of this
// checkpoint's (a path elsewhere, another step's) is refused: removing a checkpoint removes what it names.
std::vector<ListedPart> listed_parts(const std::map<std::string, std::string>& meta, const std::string& path) {
  std::vector<ListedPart> parts;
  const auto it = meta.find("parts");
  if (it == meta.end()) return parts;
  const std::string stem = fs::path(path).stem().string();
  try {
    for (const auto& entry : nlohmann::json::parse(it->second)) {
      ListedPart part{entry.at("file").get<std::string>(), entry.at("checksum").get<std::string>()};
      check(named_as_part(part.file) && fs::path(part.file).filename() == part.file &&
                part.file.rfind(stem + ".part-", 0) == 0,
            path + ": checkpoint metadata 'parts' names '" + part.file + "', which is not one of its part files");
      parts.push_back(std::move(part));
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": checkpoint metadata 'parts' is malformed: " + e.what());
  }
  return parts;
}

// The part files beside path that its header names; none when it has none or cannot be read.
std::vector<fs::path> part_files_of(const std::string& path) {
  std::vector<fs::path> files;
  try {
    for (const auto& part : listed_parts(io::read_safetensors_metadata(path), path))
      files.push_back(fs::path(path).parent_path() / part.file);
  } catch (const Error&) {
  }
  return files;
}

std::string random_tag() {
  std::random_device random;
  char text[16];
  std::snprintf(text, sizeof text, "%08x", random());
  return text;
}

// The tensors cut into runs of about equal bytes, in order: at most kMaxCheckpointParts of at least
// part_bytes each. One run: the checkpoint is written as one file.
std::vector<io::NamedTensors> cut_into_parts(const io::NamedTensors& all, int64_t part_bytes) {
  int64_t total = 0;
  for (const auto& [name, tensor] : all) total += tensor.numel() * tensor.element_size();
  const int64_t parts = std::clamp<int64_t>(total / std::max<int64_t>(part_bytes, 1), 1, kMaxCheckpointParts);
  std::vector<io::NamedTensors> runs(1);
  int64_t before = 0;
  for (const auto& named : all) {
    // A new run once the bytes before this tensor reach the next run's share.
    const auto next = static_cast<int64_t>(runs.size());
    if (!runs.back().empty() && next < parts && before * parts >= total * next) runs.emplace_back();
    runs.back().push_back(named);
    before += named.second.numel() * named.second.element_size();
  }
  return runs;
}

// Writes the runs as part files beside path, at once (one thread each), and returns how the checkpoint lists
// them. A failure removes the parts this call wrote and rethrows.
nlohmann::json write_parts(const std::string& path, const std::vector<io::NamedTensors>& runs,
                           const CheckpointWrite& write) {
  const fs::path file(path);
  const std::string tag = random_tag();
  std::vector<std::string> names(runs.size()), checksums(runs.size());
  for (size_t i = 0; i < runs.size(); ++i)
    names[i] = file.stem().string() + ".part-" + std::to_string(i) + "-" + tag + file.extension().string();
  try {
    io::for_each_index_in_parallel(runs.size(), runs.size(), [&](size_t i) {
      checksums[i] = io::write_safetensors((file.parent_path() / names[i]).string(), runs[i],
                                           {{"format", std::string(kFormat) + kPartFormatSuffix},
                                            {"part", std::to_string(i)},
                                            {"parts", std::to_string(runs.size())},
                                            {"checkpoint", file.filename().string()}},
                                           /*checksum=*/true, {}, write.before_reading, /*threads=*/1);
    });
  } catch (...) {
    std::error_code ec;
    for (const auto& name : names) fs::remove(file.parent_path() / name, ec);
    throw;
  }
  nlohmann::json listed = nlohmann::json::array();
  for (size_t i = 0; i < runs.size(); ++i) listed.push_back({{"file", names[i]}, {"checksum", checksums[i]}});
  return listed;
}

// Reads the parts the checkpoint at path lists (several at once) and appends their tensors to all, in order.
void read_parts(const std::string& path, const std::vector<ListedPart>& parts, io::NamedTensors& all) {
  std::vector<io::NamedTensors> read(parts.size());
  io::for_each_index_in_parallel(parts.size(), std::min<size_t>(parts.size(), 4), [&](size_t i) {
    const std::string file = (fs::path(path).parent_path() / parts[i].file).string();
    check(fs::is_regular_file(file), path + ": its part file " + file + " is missing (the checkpoint has " +
                                         std::to_string(parts.size()) + " part files)");
    PartFile part = load_part(file);
    check(part.checksum == parts[i].checksum,
          file + ": not the part " + path + " lists (its checksum " + part.checksum + ", listed " + parts[i].checksum +
              "): a part of another write of this step");
    read[i] = std::move(part.tensors);
  });
  for (auto& tensors : read)
    for (auto& named : tensors) all.push_back(std::move(named));
}

}  // namespace

void save_checkpoint(const std::string& path, const Checkpoint& c, const CheckpointWrite& write) {
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
  if (!c.lineage.run_id.empty()) meta["lineage"] = lineage_json(c.lineage).dump();
  fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) fs::create_directories(parent);
  // The parts a file already at path names (a step written again by a resumed run) stay until the new file
  // has replaced it.
  const auto replaced = part_files_of(path);
  const std::vector<io::NamedTensors> runs = cut_into_parts(all, write.part_bytes);
  if (runs.size() == 1) {
    io::write_safetensors(path, all, meta, /*checksum=*/true, write.before_rename, write.before_reading);
  } else {
    const nlohmann::json parts = write_parts(path, runs, write);
    meta["parts"] = parts.dump();
    try {
      io::write_safetensors(path, {}, meta, /*checksum=*/true, write.before_rename);
    } catch (...) {
      std::error_code ec;
      for (const auto& part : parts) fs::remove(parent / part.at("file").get<std::string>(), ec);
      throw;
    }
  }
  std::error_code ec;
  for (const auto& file : replaced) fs::remove(file, ec);
}

Checkpoint load_checkpoint(const std::string& path) {
  std::map<std::string, std::string> meta;
  io::NamedTensors all = io::read_safetensors(path, &meta);
  auto format = meta.find("format");
  check(format != meta.end() && format->second == kFormat,
        path + ": not a ptrain checkpoint (a weights file? use --weights for those)");
  check(meta["format_version"] == kVersion || meta["format_version"] == kUnchecksummedVersion,
        path + ": checkpoint format version " + meta["format_version"] + " is not supported (expected " + kVersion + ")");
  if (meta["format_version"] == kVersion) require_checksum(meta, path);
  Checkpoint c;
  c.format_version = meta["format_version"];
  c.position.epoch = metadata_int(meta, "epoch", path);
  c.position.micro_batch = metadata_int(meta, "micro_batch", path);
  c.position.global_step = metadata_int(meta, "global_step", path);
  c.position.world_size = metadata_int(meta, "world_size", path);
  c.position.batch_size = metadata_int(meta, "batch_size", path);
  c.lineage = lineage_of(meta, path);
  const std::vector<ListedPart> parts = listed_parts(meta, path);
  c.parts = static_cast<int64_t>(parts.size());
  read_parts(path, parts, all);
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

std::string weights_digest(const Checkpoint& c) {
  std::vector<std::pair<std::string, torch::Tensor>> sorted(c.model.begin(), c.model.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  uLong crc = ::crc32_z(0L, Z_NULL, 0);
  const auto add = [&](const void* data, size_t bytes) {
    if (bytes > 0) crc = ::crc32_z(crc, static_cast<const Bytef*>(data), bytes);  // a null buffer resets zlib's crc
  };
  for (const auto& [name, tensor] : sorted) {
    const auto cpu = tensor.detach().cpu().contiguous();
    const std::string header = name + "|" + c10::toString(cpu.scalar_type()) + "|" + c10::str(cpu.sizes());
    add(header.data(), header.size());
    add(cpu.data_ptr(), static_cast<size_t>(cpu.numel()) * cpu.element_size());
  }
  char text[32];
  std::snprintf(text, sizeof(text), "crc32:%08lx", static_cast<unsigned long>(crc));
  return text;
}

std::string shard_path(const std::string& path, int64_t rank) {
  fs::path p(path);
  char suffix[32];
  std::snprintf(suffix, sizeof(suffix), ".rank-%05lld", static_cast<long long>(rank));
  return (p.parent_path() / (p.stem().string() + suffix + p.extension().string())).string();
}

void save_shard(const std::string& path, int64_t rank, int64_t ranks, const io::NamedTensors& shards,
                const nlohmann::json& layout, const std::function<void()>& before_rename,
                const std::function<void(std::string_view)>& before_reading) {
  fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) fs::create_directories(parent);
  io::write_safetensors(shard_path(path, rank), shards,
                        {{"format", std::string(kFormat) + "-shard"},
                         {"rank", std::to_string(rank)},
                         {"ranks", std::to_string(ranks)},
                         {"layout", layout.dump()}},
                        /*checksum=*/true, before_rename, before_reading);
}

ShardFile load_shard(const std::string& path) {
  std::map<std::string, std::string> meta;
  ShardFile shard;
  shard.tensors = io::read_safetensors(path, &meta);
  check(meta["format"] == std::string(kFormat) + "-shard", path + ": not a rank file of a sharded ptrain checkpoint");
  require_checksum(meta, path);
  shard.rank = metadata_int(meta, "rank", path);
  shard.ranks = metadata_int(meta, "ranks", path);
  check(shard.rank >= 0 && shard.rank < shard.ranks,
        path + ": rank " + std::to_string(shard.rank) + " of " + std::to_string(shard.ranks) + " is no rank");
  return shard;
}

bool named_as_shard(const std::string& path) {
  static const std::regex pattern(R"(.*\.rank-\d{5,}\.safetensors)");
  return std::regex_match(fs::path(path).filename().string(), pattern);
}

PartFile load_part(const std::string& path) {
  std::map<std::string, std::string> meta;
  PartFile part;
  part.tensors = io::read_safetensors(path, &meta);
  check(meta["format"] == std::string(kFormat) + kPartFormatSuffix, path + ": not a part file of a ptrain checkpoint");
  require_checksum(meta, path);
  part.checksum = meta["ptrain_checksum"];
  part.part = metadata_int(meta, "part", path);
  part.parts = metadata_int(meta, "parts", path);
  check(part.part >= 0 && part.part < part.parts,
        path + ": part " + std::to_string(part.part) + " of " + std::to_string(part.parts) + " is no part");
  return part;
}

bool named_as_part(const std::string& path) {
  static const std::regex pattern(R"(.*\.part-\d+-[0-9a-f]{8}\.safetensors)");
  return std::regex_match(fs::path(path).filename().string(), pattern);
}

std::string checkpoint_path(const std::string& dir, int64_t global_step) {
  char name[64];
  std::snprintf(name, sizeof(name), "step-%08lld.safetensors", static_cast<long long>(global_step));
  return (fs::path(dir) / name).string();
}

namespace {

// The step of "step-<N>.safetensors" (a checkpoint, not one of its rank files), or nullopt for other
// names. A step too large for int64 is refused by name rather than skipped: skipping it would resume
// from an older checkpoint without saying so.
std::optional<int64_t> step_of(const fs::path& file) {
  static const std::regex pattern(R"(step-(\d+)\.safetensors)");
  std::smatch m;
  const std::string name = file.filename().string();
  if (!std::regex_match(name, m, pattern)) return std::nullopt;
  try {
    return std::stoll(m[1]);
  } catch (const std::out_of_range&) {
    throw Error(file.string() + ": the step number in this checkpoint's name is out of range (at most " +
                std::to_string(std::numeric_limits<int64_t>::max()) + "); rename or remove the file");
  }
}

// Checkpoints in dir, oldest first.
std::vector<std::pair<int64_t, fs::path>> checkpoints_in(const std::string& dir) {
  std::vector<std::pair<int64_t, fs::path>> found;
  if (!fs::is_directory(dir)) return found;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (const auto step = step_of(entry.path())) found.emplace_back(*step, entry.path());
  }
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::string> paths;
  for (const auto& [step, path] : checkpoints_in(dir)) paths.push_back(path.string());
  return paths;
}

bool remove_checkpoint(const std::string& path) {
  std::error_code ec;
  const auto parts = part_files_of(path);
  for (int64_t r = 0;; ++r) {
    const std::string shard = shard_path(path, r);
    if (!fs::exists(shard)) break;
    fs::remove(shard, ec);
  }
  const bool removed = fs::remove(path, ec);
  // A thread a part: the kernel frees a removed file's pages in the thread that removes it, about a second for
  // GPT-2 large's 9.4 GB in one thread on the H100 host's tmpfs (docs/results/2026-12-06-gpu-async-checkpoint.md).
  std::vector<std::thread> removing;
  for (const auto& part : parts)
    removing.emplace_back([part] {
      std::error_code part_ec;
      fs::remove(part, part_ec);
    });
  for (auto& thread : removing) thread.join();
  return removed;
}

CheckpointHeader read_checkpoint_header(const std::string& path) {
  const auto meta = io::read_safetensors_metadata(path);
  const auto format = meta.find("format");
  check(format != meta.end() && format->second == kFormat, path + ": not a ptrain checkpoint");
  return {metadata_int(meta, "global_step", path), lineage_of(meta, path)};
}

namespace {

struct Listed {
  int64_t step;
  fs::path path;
  Lineage lineage;
};

// The checkpoints in dir in the order they were written: those without lineage first, by step. Headers
// that cannot be read throw (unless unreadable_first: then they count as written first, by step).
std::vector<Listed> in_write_order(const std::string& dir, bool unreadable_first) {
  std::vector<Listed> listed;
  for (const auto& [step, path] : checkpoints_in(dir)) {
    Lineage lineage;
    try {
      lineage = read_checkpoint_header(path.string()).lineage;
    } catch (const Error&) {
      if (!unreadable_first) throw;
    }
    listed.push_back({step, path, lineage});
  }
  std::stable_sort(listed.begin(), listed.end(), [](const Listed& a, const Listed& b) {
    return std::make_pair(a.lineage.sequence, a.step) < std::make_pair(b.lineage.sequence, b.step);
  });
  return listed;
}

}  // namespace

LatestCheckpoint find_latest_checkpoint(const std::string& dir) {
  const auto listed = in_write_order(dir, /*unreadable_first=*/false);
  if (listed.empty()) return {};
  const Listed& newest = listed.back();
  LatestCheckpoint latest{newest.path.string(), {}};
  if (newest.lineage.run_id.empty()) return latest;  // no lineage anywhere: the highest step, as ever
  // The line is the newest's run up to its step, then the run it resumed from up to the parent's step,
  // and so on; every checkpoint of one run names the same parent.
  std::map<std::string, std::pair<std::string, int64_t>> parent_of;
  for (const auto& c : listed)
    if (!c.lineage.run_id.empty()) parent_of[c.lineage.run_id] = {c.lineage.parent_run_id, c.lineage.parent_step};
  std::vector<std::pair<std::string, int64_t>> line{{newest.lineage.run_id, newest.step}};
  while (line.size() <= parent_of.size()) {  // a parent cycle (hand-edited files) ends with the runs
    const auto it = parent_of.find(line.back().first);
    if (it == parent_of.end() || it->second.second < 0) break;
    line.push_back(it->second);
    if (it->second.first.empty()) break;  // resumed from a checkpoint without lineage: none before it
  }
  const auto on_line = [&](const Listed& c) {
    return std::any_of(line.begin(), line.end(), [&](const auto& segment) {
      return c.lineage.run_id == segment.first && c.step <= segment.second;
    });
  };
  std::vector<std::pair<int64_t, std::string>> passed;
  for (const auto& c : listed)
    if (c.step > newest.step && !on_line(c)) passed.emplace_back(c.step, c.path.string());
  std::sort(passed.begin(), passed.end());
  for (auto& [step, path] : passed) latest.passed_over.push_back(std::move(path));
  return latest;
}

std::string latest_checkpoint(const std::string& dir) { return find_latest_checkpoint(dir).path; }

int64_t highest_sequence(const std::string& dir) {
  const auto listed = in_write_order(dir, /*unreadable_first=*/true);
  return listed.empty() ? 0 : listed.back().lineage.sequence;
}

int64_t remove_stale_temporaries(const std::string& dir) {
  if (!fs::is_directory(dir)) return 0;
  // What io::write_file_atomically leaves behind when killed mid-write: "<file>.tmp.XXXXXX".
  static const std::regex temporary(
      R"(step-\d+(\.rank-\d+|\.part-\d+-[0-9a-f]{8})?\.safetensors\.tmp\.[A-Za-z0-9]{6})");
  static const std::regex part(R"((step-\d+)\.part-\d+-[0-9a-f]{8}\.safetensors)");
  std::map<std::string, std::vector<fs::path>> named_by;  // a checkpoint's name -> the parts it names
  const auto named = [&](const std::string& checkpoint, const fs::path& file) {
    const auto it = named_by.find(checkpoint);
    const auto& parts = it != named_by.end() ? it->second
                                             : named_by[checkpoint] = part_files_of((fs::path(dir) / checkpoint).string());
    return std::any_of(parts.begin(), parts.end(), [&](const fs::path& p) { return p.filename() == file.filename(); });
  };
  int64_t removed = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    std::error_code ec;
    std::smatch m;
    const bool stale = std::regex_match(name, temporary) ||
                       (std::regex_match(name, m, part) && !named(m[1].str() + ".safetensors", entry.path()));
    if (stale && entry.is_regular_file(ec) && fs::remove(entry.path(), ec)) ++removed;
  }
  return removed;
}

std::vector<std::string> prune_checkpoints(const std::string& dir, int64_t keep, const std::string& protect) {
  std::vector<std::string> removed;
  if (keep <= 0) return removed;
  // In the order of writes, not of steps: a line resumed from an older step must not lose its new
  // checkpoints to an abandoned branch's higher steps. A file whose header cannot be read goes first.
  auto found = in_write_order(dir, /*unreadable_first=*/true);
  if (static_cast<int64_t>(found.size()) <= keep) return removed;
  found.resize(found.size() - static_cast<size_t>(keep));  // the older ones
  std::sort(found.begin(), found.end(), [](const Listed& a, const Listed& b) { return a.step < b.step; });
  std::error_code ec;
  const fs::path protected_path = protect.empty() ? fs::path() : fs::weakly_canonical(protect, ec);
  for (const auto& c : found) {
    if (!protect.empty() && fs::weakly_canonical(c.path, ec) == protected_path) continue;
    if (remove_checkpoint(c.path.string())) removed.push_back(c.path.string());
  }
  return removed;
}

}  // namespace ptrain::train
