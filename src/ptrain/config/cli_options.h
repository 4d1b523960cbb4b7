// Binds every field of TrainConfig to a command-line flag, and lets a YAML file give the same keys.
// One table of options serves both, so a key in a file and a flag cannot drift apart.
#pragma once

#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "ptrain/config/train_config.h"

namespace ptrain::config {

// Adds the flags of `ptrain train` to app, writing into config (which must outlive the parse).
// Returns the --config option. Every option also reads the environment variable env_name_of(its flag).
CLI::Option* add_train_options(CLI::App& app, TrainConfig& config);

// The environment variable of a flag name without dashes: "batch-size" -> "PTRAIN_BATCH_SIZE".
std::string env_name_of(const std::string& flag);

// The long names (without dashes) of the options app has been given: on the command line, by PTRAIN_*
// variables or by apply_yaml_config. Their values win over those of a file read later.
std::set<std::string> flags_given(const CLI::App& app);

// What a usage error CLI11 found says, as ptrain says it: "--batch-size is given twice: keep one" for CLI11's
// "--batch-size: At Most 1 required but received 2"; the others' words as CLI11 has them.
std::string usage_message(const CLI::Error& error);

// After app has parsed the command line: applies the YAML file's keys to every option the command
// line did not set (flags win). Keys are flag names without dashes; '_' and '-' are interchangeable.
// Unknown keys and bad values throw ptrain::Error naming the file and the key.
void apply_yaml_config(CLI::App& app, const std::string& yaml_path);

// The `device` key of the YAML file a `ptrain train` command line names with --config (program, "train",
// arguments), for a launcher that must know whether its ranks train on GPUs before they start; "" when the
// command is no `ptrain train`, names no regular file (a FIFO is left to the ranks), or the file has no such
// key or cannot be read (the rank says why when it reads the file itself).
std::string device_in_train_config(const std::vector<std::string>& command);

}  // namespace ptrain::config
