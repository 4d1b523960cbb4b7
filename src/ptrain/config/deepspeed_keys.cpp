#include "ptrain/config/deepspeed_keys.h"

#include <cmath>
#include <fstream>

#include "ptrain/core/error.h"

namespace ptrain::config::deepspeed {

json load_object(const std::string& path) {
  std::ifstream in(path);
  check(in.good(), path + ": cannot open the DeepSpeed config");
  json root;
  try {
    root = json::parse(in);
  } catch (const json::parse_error& e) {
    throw Error(path + ": not valid JSON: " + e.what());
  }
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
