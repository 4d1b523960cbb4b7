#include "ptrain/config/deepspeed_keys.h"

#include <cmath>
#include <fstream>
#include <set>
#include <utility>
#include <vector>

#include "ptrain/core/error.h"

namespace ptrain::config::deepspeed {

json load_object(const std::string& path) {
  std::ifstream in(path);
  check(in.good(), path + ": cannot open the DeepSpeed config");
  // nlohmann's parser keeps the last of a key given twice in one object: the file's reader may have meant the
  // other. The parse's callback sees every key of every object, as ptrain's own YAML configs' check does.
  std::vector<std::pair<std::string, std::set<std::string>>> objects;  // the open objects: their path, keys
  std::string key, duplicate;
  const json::parser_callback_t callback = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      const std::string outer = objects.empty() ? "" : objects.back().first;
      objects.push_back({objects.empty() ? "" : outer.empty() ? key : outer + "." + key, {}});
    } else if (event == json::parse_event_t::object_end) {
      objects.pop_back();
    } else if (event == json::parse_event_t::key) {
      key = parsed.get<std::string>();
      const std::string& outer = objects.back().first;
      if (!objects.back().second.insert(key).second && duplicate.empty()) duplicate = outer.empty() ? key : outer + "." + key;
    }
    return true;
  };
  json root;
  try {
    root = json::parse(in, callback);
  } catch (const json::parse_error& e) {
    throw Error(path + ": not valid JSON: " + e.what());
  }
  check(duplicate.empty(), path + ": key '" + duplicate + "' is given twice: keep one");
  check(root.is_object(), path + ": a DeepSpeed config is a JSON object of keys to values");
  return root;
}

bool is_auto(const json& value) { return value.is_string() && value.get<std::string>() == "auto"; }

void KeyReader::warn(const std::string& key, const std::string& why) const {
  warnings_->push_back(where(key) + " has no equivalent in ptrain and is not applied: it " + why);
}

const json& KeyReader::object(const json& value, const std::string& key) const {
  check(value.is_object(), where(key) + " must be an object");
  return value;
}

double KeyReader::number(const json& value, const std::string& key) const {
  check(value.is_number(), where(key) + " must be a number, not " + value.dump());
  return value.get<double>();
}

double KeyReader::non_negative(const json& value, const std::string& key) const {
  const double n = number(value, key);
  check(n >= 0.0 && std::isfinite(n), where(key) + " must be a non-negative number, not " + value.dump());
  return n;
}

int64_t KeyReader::integer(const json& value, const std::string& key) const {
  const double n = number(value, key);
  check(std::floor(n) == n && std::abs(n) < 9e18, where(key) + " must be a whole number, not " + value.dump());
  return static_cast<int64_t>(n);
}

int64_t KeyReader::positive_integer(const json& value, const std::string& key) const {
  const int64_t n = integer(value, key);
  check(n > 0, where(key) + " must be positive, not " + value.dump());
  return n;
}

bool KeyReader::boolean(const json& value, const std::string& key) const {
  check(value.is_boolean(), where(key) + " must be true or false, not " + value.dump());
  return value.get<bool>();
}

}  // namespace ptrain::config::deepspeed
