#include "ptrain/metrics/scalar_log.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "ptrain/core/error.h"
#include "ptrain/io/atomic_file.h"

namespace ptrain::metrics {

namespace {

// The lines of an earlier run's log up to (and including) step `last`; lines that do not parse (the last one
// of a run killed mid-write) are dropped.
std::string lines_up_to(const std::string& path, int64_t last) {
  std::ifstream in(path);
  std::string line, kept;
  while (std::getline(in, line)) {
    const auto record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (record.is_object() && record.contains("step") && record["step"].is_number_integer() &&
        record["step"].get<int64_t>() <= last)
      kept += line + "\n";
  }
  return kept;
}

}  // namespace

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

ScalarLog::ScalarLog(const std::string& tensorboard_dir, const std::string& jsonl_path,
                     std::optional<int64_t> resumed_after)
    : jsonl_path_(jsonl_path) {
  if (!tensorboard_dir.empty()) {
    tensorboard_ = std::make_unique<TensorBoardWriter>(tensorboard_dir, "--tensorboard", unix_seconds());
    if (resumed_after) tensorboard_->add_restart(*resumed_after + 1, unix_seconds());
  }
  if (!jsonl_path.empty()) {
    std::error_code error;
    const auto parent = std::filesystem::path(jsonl_path).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, error);
    check(!error, "--log-jsonl " + jsonl_path + ": cannot create " + parent.string() + " (" + error.message() + ")");
    const io::OutputTarget target = io::output_target(jsonl_path);
    if (target.in_place) {
      // /dev/stdout of `ptrain train > log`, a FIFO: appended to, never truncated, nothing read back.
      const int fd = io::open_in_place(target, jsonl_path);
      jsonl_ = ::fdopen(fd, "a");
      if (jsonl_ == nullptr) ::close(fd);
    } else {
      if (resumed_after && std::filesystem::is_regular_file(jsonl_path, error))
        io::write_file_atomically(jsonl_path, lines_up_to(jsonl_path, *resumed_after));
      jsonl_ = std::fopen(jsonl_path.c_str(), resumed_after ? "a" : "w");
    }
    const int open_error = errno;
    check(jsonl_ != nullptr, "--log-jsonl " + jsonl_path + ": cannot open (" + std::strerror(open_error) + ")");
  }
}

ScalarLog::~ScalarLog() {
  if (jsonl_ != nullptr) std::fclose(jsonl_);
}

const std::string& ScalarLog::tensorboard_file() const {
  static const std::string none;
  return tensorboard_ ? tensorboard_->path() : none;
}

void ScalarLog::log(const std::string& kind, int64_t step, double epoch, const Scalars& scalars) {
  const double wall_time = unix_seconds();
  if (tensorboard_) {
    try {
      tensorboard_->add_scalars(step, wall_time, scalars);
    } catch (const Error& e) {
      tensorboard_.reset();
      give_up("--tensorboard", std::string("--tensorboard: ") + e.what());
    }
  }
  if (jsonl_ != nullptr) {
    nlohmann::ordered_json record{{"kind", kind}, {"step", step}, {"epoch", epoch}, {"wall_time", wall_time}};
    for (const auto& [tag, value] : scalars) record[tag] = value;  // a non-finite value is written as null
    const std::string line = record.dump() + "\n";
    const bool written = std::fwrite(line.data(), 1, line.size(), jsonl_) == line.size() && std::fflush(jsonl_) == 0;
    if (!written) {
      const int error = errno;
      std::fclose(jsonl_);
      jsonl_ = nullptr;
      give_up("--log-jsonl", "--log-jsonl " + jsonl_path_ + ": cannot write (" + std::strerror(error) + ")");
    }
  }
}

void ScalarLog::give_up(const std::string& flag, const std::string& message) {
  failed_.push_back(flag);
  std::cerr << "ptrain: warning: " << message << "; training goes on without this log" << std::endl;
}

}  // namespace ptrain::metrics
