#include "ptrain/config/number_checks.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "ptrain/core/error.h"

namespace ptrain::config {

namespace {

// Integers beyond int64 (uint64 for a seed) would be cut to the limit or wrapped by the conversion that
// follows: 9223372036854775808 epochs or a seed of -1 must be refused, not changed.
std::string check_integer_range(const std::string& text, bool unsigned_64) {
  size_t digits = text.find_first_not_of(' ');
  if (digits == std::string::npos) return {};
  if (text[digits] == '+' || text[digits] == '-') ++digits;
  if (digits >= text.size() || text.find_first_not_of("0123456789 ", digits) != std::string::npos) return {};
  errno = 0;
  if (unsigned_64 && text[text.find_first_not_of(' ')] != '-') {
    (void)std::strtoull(text.c_str(), nullptr, 10);
  } else {
    (void)std::strtoll(text.c_str(), nullptr, 10);
  }
  if (errno != ERANGE) return {};
  return "'" + text + "' is out of range (at most " +
         (unsigned_64 ? std::to_string(std::numeric_limits<uint64_t>::max())
                      : std::to_string(std::numeric_limits<int64_t>::max())) +
         ")";
}

// Empty when text is a finite number inside the bounds, else what is wrong with it.
std::string check_number(const std::string& text, double low, bool low_inclusive, double high, bool unsigned_64 = false) {
  if (auto range = check_integer_range(text, unsigned_64); !range.empty()) return range;
  const char* begin = text.c_str();
  char* end = nullptr;
  const double value = std::strtod(begin, &end);
  while (end != nullptr && *end == ' ') ++end;
  if (end == begin || *end != '\0') return "'" + text + "' is not a number";
  return range_problem(value, text, low, low_inclusive, high);
}

CLI::Validator validator(double low, bool low_inclusive, double high, const std::string& name) {
  return CLI::Validator(
      [=](std::string& input) { return check_number(input, low, low_inclusive, high); }, name);
}

}  // namespace

std::string decimal_number_problem(std::string& text, bool integer) {
  const size_t first = text.find_first_not_of(' ');
  if (first == std::string::npos) return {};
  const size_t last = text.find_last_not_of(' ');
  const size_t sign = text[first] == '+' || text[first] == '-' ? 1 : 0;
  const std::string digits = text.substr(first + sign, last + 1 - first - sign);
  if (digits.size() >= 2 && digits[0] == '0' && std::string("xXoObB").find(digits[1]) != std::string::npos)
    return "'" + text + "' is not a decimal number (ptrain reads numbers in base 10 only: no 0x, 0o or 0b forms)";
  if (!integer || digits.size() < 2 || digits[0] != '0' ||
      digits.find_first_not_of("0123456789") != std::string::npos)
    return {};
  text = text.substr(first, sign) + digits.substr(std::min(digits.find_first_not_of('0'), digits.size() - 1));
  return {};
}

CLI::Validator decimal_number(bool integer) {
  return CLI::Validator([integer](std::string& input) { return decimal_number_problem(input, integer); }, "",
                        "DECIMAL");
}

void read_numbers_as_decimal(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    const std::string type = opt->get_type_name();
    const std::string base = type.substr(0, type.find(':'));
    if (base != "INT" && base != "UINT" && base != "FLOAT") continue;
    try {
      opt->get_validator("DECIMAL");
      continue;  // already reads decimal
    } catch (const CLI::OptionNotFound&) {
    }
    opt->transform(decimal_number(/*integer=*/base != "FLOAT"));
  }
  for (CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) read_numbers_as_decimal(*sub);
}

int64_t decimal_integer(const std::string& text, const std::string& where) {
  std::string value = text;
  const std::string problem = decimal_number_problem(value, /*integer=*/true);
  check(problem.empty(), where + ": " + problem);
  const size_t first = value.find_first_not_of(' ');
  char* end = nullptr;
  errno = 0;
  const long long n = first == std::string::npos ? 0 : std::strtoll(value.c_str() + first, &end, 10);
  while (end != nullptr && *end == ' ') ++end;
  check(end != nullptr && end != value.c_str() + first && *end == '\0', where + " must be an integer, not '" + text + "'");
  check(errno != ERANGE, where + ": '" + text + "' is out of range");
  return n;
}

std::string range_problem(double value, const std::string& text, double low, bool low_inclusive, double high) {
  if (!std::isfinite(value))
    return "'" + text + "' is not a finite number";
  const bool below = low_inclusive ? value < low : value <= low;
  if (!below && value <= high) return {};
  const std::string lower = (low_inclusive ? "at least " : "greater than ") + readable_number(low);
  // A float's limit is no range people choose from: name the side that was crossed, not "between 0 and 3.4e38".
  if (std::isinf(high) || (high >= kFloatMax && below)) return "must be " + lower + ", not " + text;
  if (high >= kFloatMax) return "must be at most " + readable_number(high) + " (the largest float), not " + text;
  return "must be between " + readable_number(low) + " and " + readable_number(high) + ", not " + text;
}

std::string exact_number_text(double value) {
  char text[40];
  for (int digits = 15; digits <= 17; ++digits) {
    std::snprintf(text, sizeof(text), "%.*g", digits, value);
    if (std::strtod(text, nullptr) == value) break;
  }
  return text;
}

std::string readable_number(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.6g", value);
  return text;
}

CLI::Validator seed_number() {
  return CLI::Validator([](std::string& input) { return check_number(input, 0.0, true, INFINITY, true); }, "SEED");
}
CLI::Validator positive_number() { return validator(0.0, false, INFINITY, "POSITIVE"); }
CLI::Validator non_negative_number() { return validator(0.0, true, INFINITY, "NONNEGATIVE"); }
CLI::Validator positive_float() { return validator(0.0, false, kFloatMax, "POSITIVE"); }
CLI::Validator non_negative_float() { return validator(0.0, true, kFloatMax, "NONNEGATIVE"); }
CLI::Validator number_in(double low, double high) {
  return validator(low, true, high, "[" + readable_number(low) + ", " + readable_number(high) + "]");
}

}  // namespace ptrain::config
