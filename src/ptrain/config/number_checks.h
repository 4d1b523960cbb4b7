// CLI11 validators for numeric flags that refuse NaN and infinities and print their bounds readably.
// CLI11's own Range passes NaN (every comparison with it is false) and prints DBL_MAX in full, 310 digits.
// They run on the text of a flag, a --config YAML key, a PTRAIN_* variable and a ds_config value alike.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace ptrain::config {

// The largest float. Settings LibTorch holds as floats (learning rates, weight decay, momentum, eps, betas,
// the clipping norm, loss scales) are bounded by it: beyond it LibTorch fails mid-run with "value cannot be
// converted to type float without overflow", naming no setting.
constexpr double kFloatMax = 3.4028234663852886e38;

// A finite number > 0.
CLI::Validator positive_number();
// A finite number >= 0.
CLI::Validator non_negative_number();
// A number > 0 (>= 0) that a float holds: at most kFloatMax.
CLI::Validator positive_float();
CLI::Validator non_negative_float();
// A finite number in [low, high].
CLI::Validator number_in(double low, double high);
// A seed: an integer from 0 to 2^64-1. (The others refuse integers beyond int64.)
CLI::Validator seed_number();

// Numbers are decimal wherever ptrain reads them (flags, --config keys, PTRAIN_* variables, accelerate configs):
// CLI11 and yaml-cpp read C's forms, so that "010" was eight (octal), "09" no number and "0x20" 32. A leading
// zero is a zero (010 is ten); hexadecimal, octal and binary prefixes (0x, 0o, 0b) are refused.
// Empty when text is no number in another base, else what is wrong with it; an integer's leading zeros (and
// the spaces around it) are dropped from text.
std::string decimal_number_problem(std::string& text, bool integer);
// The same as a CLI11 transform; read_numbers_as_decimal puts it first on every numeric option.
CLI::Validator decimal_number(bool integer);
// Every integer and floating-point option of app and of its subcommands (by their CLI11 type, INT, UINT or
// FLOAT) reads its flag, --config key and PTRAIN_* variable as decimal_number_problem says. Calling it again
// changes nothing.
void read_numbers_as_decimal(CLI::App& app);
// An integer, decimal as above, from a value of an accelerate config or another file: where (the file and
// key) starts the error.
int64_t decimal_integer(const std::string& text, const std::string& where);

// The text of a number as people write it: 0.1, 65536, 1e+06, not 0.100000 or 310 digits.
std::string readable_number(double value);

// The shortest text that reads back as the same double (3e-4 stays "0.0003").
std::string exact_number_text(double value);

// Empty when value (written as text) is finite and in [low, high] (low excluded unless low_inclusive),
// else what is wrong with it: what the validators above say of a flag's text, for a typed value.
std::string range_problem(double value, const std::string& text, double low, bool low_inclusive, double high);

}  // namespace ptrain::config
