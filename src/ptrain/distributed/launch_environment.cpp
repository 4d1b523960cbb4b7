#include "ptrain/distributed/launch_environment.h"

#include <algorithm>
#include <cerrno>
#include <optional>

#include "ptrain/core/error.h"

namespace ptrain::distributed {
namespace {

using Getenv = std::function<const char*(const char*)>;

std::optional<std::string> read(const Getenv& getenv, const char* name) {
  const char* value = getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

int64_t parse_integer(const std::string& text, const std::string& what) {
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE) {
    throw Error("environment: " + what + "='" + text + "' is not an integer");
  }
  return value;
}

int64_t integer_var(const Getenv& getenv, const char* name) {
  const auto value = read(getenv, name);
  check(value.has_value(), std::string("environment: ") + name + " is not set");
  return parse_integer(*value, name);
}

int64_t integer_var_or(const Getenv& getenv, const char* name, int64_t fallback) {
  const auto value = read(getenv, name);
  return value ? parse_integer(*value, name) : fallback;
}

void read_master(const Getenv& getenv, LaunchEnvironment& env) {
  if (auto addr = read(getenv, "MASTER_ADDR")) env.master_addr = *addr;
  const int64_t port = integer_var_or(getenv, "MASTER_PORT", env.master_port);
  check(port > 0 && port < 65536, "environment: MASTER_PORT=" + std::to_string(port) + " is not a TCP port (1-65535)");
  env.master_port = static_cast<int>(port);
}

void validate(const LaunchEnvironment& env, const std::string& rank_var, const std::string& world_var,
              const std::string& local_rank_var, const std::string& local_world_var) {
  check(env.world_size >= 1, "environment: " + world_var + "=" + std::to_string(env.world_size) + " must be at least 1");
  check(env.rank >= 0 && env.rank < env.world_size,
        "environment: " + rank_var + "=" + std::to_string(env.rank) + " is outside [0, " + world_var + "=" +
            std::to_string(env.world_size) + ")");
  check(env.local_world_size >= 1 && env.local_world_size <= env.world_size,
        "environment: " + local_world_var + "=" + std::to_string(env.local_world_size) + " must be in [1, " +
            world_var + "=" + std::to_string(env.world_size) + "]");
  check(env.local_rank >= 0 && env.local_rank < env.local_world_size,
        "environment: " + local_rank_var + "=" + std::to_string(env.local_rank) + " is outside [0, " +
            local_world_var + "=" + std::to_string(env.local_world_size) + ")");
}

LaunchEnvironment from_torchrun(const Getenv& getenv) {
  LaunchEnvironment env;
  env.source = "torchrun";
  env.rank = integer_var(getenv, "RANK");
  env.world_size = integer_var(getenv, "WORLD_SIZE");
  // A hand-started single-node job often sets only RANK and WORLD_SIZE: then every rank is local.
  env.local_rank = integer_var_or(getenv, "LOCAL_RANK", env.rank);
  env.local_world_size = integer_var_or(getenv, "LOCAL_WORLD_SIZE", env.world_size);
  read_master(getenv, env);
  // torchrun's static rendezvous leaves its --rdzv-id at "none": no name at all.
  if (auto run_id = read(getenv, "TORCHELASTIC_RUN_ID"); run_id && *run_id != "none") env.run_id = *run_id;
  validate(env, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
  return env;
}

LaunchEnvironment from_slurm(const Getenv& getenv) {
  LaunchEnvironment env;
  env.source = "slurm";
  env.rank = integer_var(getenv, "SLURM_PROCID");
  env.world_size = integer_var(getenv, "SLURM_NTASKS");
  env.local_rank = integer_var_or(getenv, "SLURM_LOCALID", 0);
  if (auto per_node = read(getenv, "SLURM_NTASKS_PER_NODE")) {
    env.local_world_size = parse_integer(*per_node, "SLURM_NTASKS_PER_NODE");
  } else if (auto tasks = read(getenv, "SLURM_TASKS_PER_NODE")) {
    env.local_world_size = slurm_tasks_on_node(*tasks, integer_var_or(getenv, "SLURM_NODEID", 0));
  } else {
    env.local_world_size = env.world_size;
  }
  auto nodelist = read(getenv, "SLURM_JOB_NODELIST");
  if (!nodelist) nodelist = read(getenv, "SLURM_NODELIST");
  if (nodelist) env.master_addr = first_slurm_host(*nodelist);
  read_master(getenv, env);
  if (auto job = read(getenv, "SLURM_JOB_ID")) env.run_id = "slurm-" + *job + "." + read(getenv, "SLURM_STEP_ID").value_or("");
  validate(env, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE/SLURM_TASKS_PER_NODE");
  return env;
}

LaunchEnvironment from_openmpi(const Getenv& getenv) {
  LaunchEnvironment env;
  env.source = "openmpi";
  env.rank = integer_var(getenv, "OMPI_COMM_WORLD_RANK");
  env.world_size = integer_var(getenv, "OMPI_COMM_WORLD_SIZE");
  env.local_rank = integer_var_or(getenv, "OMPI_COMM_WORLD_LOCAL_RANK", env.rank);
  env.local_world_size = integer_var_or(getenv, "OMPI_COMM_WORLD_LOCAL_SIZE", env.world_size);
  read_master(getenv, env);
  validate(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
           "OMPI_COMM_WORLD_LOCAL_SIZE");
  return env;
}

}  // namespace

// Slurm's hostlist syntax has no Debian library outside Slurm itself; only the first host is needed.
std::string first_slurm_host(const std::string& nodelist) {
  std::string host;
  size_t i = 0;
  int depth = 0;
  bool in_first_range_item = false;
  for (; i < nodelist.size(); ++i) {
    const char c = nodelist[i];
    if (c == '[') {
      check(depth == 0, "environment: SLURM_NODELIST='" + nodelist + "' has nested brackets");
      depth = 1;
      in_first_range_item = true;
    } else if (c == ']') {
      check(depth == 1, "environment: SLURM_NODELIST='" + nodelist + "' has an unmatched ']'");
      depth = 0;
    } else if (depth == 1) {
      // Inside brackets, keep the first number of the first range ("01" of "01-04,07").
      if (c == '-' || c == ',') in_first_range_item = false;
      if (in_first_range_item) host += c;
    } else if (c == ',') {
      break;  // the next host list entry
    } else {
      host += c;
    }
  }
  check(depth == 0, "environment: SLURM_NODELIST='" + nodelist + "' has an unmatched '['");
  check(!host.empty(), "environment: SLURM_NODELIST='" + nodelist + "' names no host");
  return host;
}

int64_t slurm_tasks_on_node(const std::string& tasks_per_node, int64_t node_index) {
  check(node_index >= 0, "environment: SLURM_NODEID=" + std::to_string(node_index) + " is negative");
  int64_t node = 0;
  size_t pos = 0;
  while (pos < tasks_per_node.size()) {
    size_t end = tasks_per_node.find(',', pos);
    if (end == std::string::npos) end = tasks_per_node.size();
    const std::string item = tasks_per_node.substr(pos, end - pos);
    int64_t repeat = 1;
    std::string count_text = item;
    const size_t paren = item.find('(');
    if (paren != std::string::npos) {
      check(item.size() > paren + 3 && item[paren + 1] == 'x' && item.back() == ')',
            "environment: SLURM_TASKS_PER_NODE='" + tasks_per_node + "' has a malformed entry '" + item + "'");
      count_text = item.substr(0, paren);
      repeat = parse_integer(item.substr(paren + 2, item.size() - paren - 3), "SLURM_TASKS_PER_NODE");
    }
    const int64_t count = parse_integer(count_text, "SLURM_TASKS_PER_NODE");
    if (node_index < node + repeat) return count;
    node += repeat;
    pos = end + 1;
  }
  throw Error("environment: SLURM_TASKS_PER_NODE='" + tasks_per_node + "' lists " + std::to_string(node) +
              " nodes, but SLURM_NODEID=" + std::to_string(node_index));
}

std::string rank_variables(const LaunchEnvironment& env) {
  const auto both = [&](const char* rank, const char* world, const char* launcher) {
    return std::string(rank) + "=" + std::to_string(env.rank) + " and " + world + "=" + std::to_string(env.world_size) +
           " (" + launcher + ")";
  };
  if (env.source == "torchrun") return both("RANK", "WORLD_SIZE", "torchrun or ptrain launch");
  if (env.source == "slurm") return both("SLURM_PROCID", "SLURM_NTASKS", "Slurm");
  if (env.source == "openmpi") return both("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI");
  return "";
}

LaunchEnvironment detect_environment(const Getenv& getenv) {
  if (read(getenv, "RANK") || read(getenv, "WORLD_SIZE")) return from_torchrun(getenv);
  if (read(getenv, "SLURM_PROCID")) return from_slurm(getenv);
  if (read(getenv, "OMPI_COMM_WORLD_RANK")) return from_openmpi(getenv);
  LaunchEnvironment env;
  read_master(getenv, env);
  return env;
}

RestartInfo detect_restart(const Getenv& getenv) {
  RestartInfo info;
  info.count = integer_var_or(getenv, "PTRAIN_RESTART_COUNT", 0);
  check(info.count >= 0, "environment: PTRAIN_RESTART_COUNT=" + std::to_string(info.count) + " is negative");
  if (info.count == 0) return info;
  const std::string causes = read(getenv, "PTRAIN_RESTART_CAUSES").value_or("");
  size_t start = 0;
  while (start < causes.size()) {
    const size_t end = std::min(causes.find('\n', start), causes.size());
    if (end > start) info.causes.push_back(causes.substr(start, end - start));
    start = end + 1;
  }
  return info;
}

}  // namespace ptrain::distributed
