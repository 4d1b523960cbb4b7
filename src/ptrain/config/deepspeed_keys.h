// Reading a DeepSpeed ds_config.json: the file as one JSON object, and its values read by type, each
// error naming the file and the key ("ds.json: key 'fp16.hysteresis' must be positive, not 0"). "auto"
// (as accelerate and the HF Trainer write it) stands for ptrain's own value: readers name it in the overlay's
// auto_keys. A key given twice in one object is an error.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace ptrain::config::deepspeed {

using json = nlohmann::json;

// The file parsed; a file that cannot be read, is not JSON or is not one object is an error naming it.
json load_object(const std::string& path);

bool is_auto(const json& value);

// Values of one file by type; warnings go to the list given (the overlay's).
class KeyReader {
 public:
  KeyReader(std::string path, std::vector<std::string>& warnings) : path_(std::move(path)), warnings_(&warnings) {}

  const std::string& path() const { return path_; }
  // "<file>: key '<key>'", how every message about a key starts.
  std::string where(const std::string& key) const { return path_ + ": key '" + key + "'"; }
  // Names a key the file gives that ptrain does not apply, and why; the run goes on.
  void warn(const std::string& key, const std::string& why) const;
  // A warning of its own wording.
  void note(const std::string& text) const { warnings_->push_back(text); }

  const json& object(const json& value, const std::string& key) const;
  double number(const json& value, const std::string& key) const;
  double non_negative(const json& value, const std::string& key) const;
  int64_t integer(const json& value, const std::string& key) const;
  int64_t positive_integer(const json& value, const std::string& key) const;
  bool boolean(const json& value, const std::string& key) const;

 private:
  std::string path_;
  std::vector<std::string>* warnings_;
};

}  // namespace ptrain::config::deepspeed
