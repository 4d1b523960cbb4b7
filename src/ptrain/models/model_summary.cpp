#include "ptrain/models/model_summary.h"

#include <algorithm>
#include <cstdio>
#include <iomanip>
#include <map>
#include <sstream>

namespace ptrain::models {

namespace {

std::string dtype_name(c10::ScalarType type) {
  switch (type) {
    case c10::ScalarType::Float: return "float32";
    case c10::ScalarType::Half: return "float16";
    case c10::ScalarType::BFloat16: return "bfloat16";
    case c10::ScalarType::Double: return "float64";
    default: return c10::toString(type);
  }
}

std::string top_level_name(const std::string& name) { return name.substr(0, name.find('.')); }

}  // namespace

ModelSummary summarize_model(const torch::nn::Module& model) {
  ModelSummary summary;
  std::map<std::string, size_t> part_index;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    const auto& p = item.value();
    const std::string part = top_level_name(item.key());
    auto found = part_index.find(part);
    if (found == part_index.end()) {
      found = part_index.emplace(part, summary.parts.size()).first;
      summary.parts.push_back({part, 0, 0});
    }
    auto& entry = summary.parts[found->second];
    entry.parameters += p.numel();
    summary.parameters += p.numel();
    if (p.requires_grad()) {
      entry.trainable += p.numel();
      summary.trainable += p.numel();
    }
    summary.parameter_bytes += p.numel() * static_cast<int64_t>(p.element_size());
    const std::string dtype = dtype_name(p.scalar_type());
    bool counted = false;
    for (auto& [name, count] : summary.dtypes) {
      if (name == dtype) {
        count += p.numel();
        counted = true;
      }
    }
    if (!counted) summary.dtypes.emplace_back(dtype, p.numel());
  }
  for (const auto& b : model.buffers(/*recurse=*/true)) {
    summary.buffers += b.numel();
    summary.buffer_bytes += b.numel() * static_cast<int64_t>(b.element_size());
  }
  return summary;
}

std::string with_commas(int64_t n) {
  const bool negative = n < 0;
  std::string digits = std::to_string(negative ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return negative ? "-" + out : out;
}

std::string byte_text(int64_t bytes) {
  static const char* const units[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double value = static_cast<double>(bytes) / 1024;
  int unit = 0;
  while (value >= 1024 && unit < 3) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f %s", value, units[unit]);
  return text;
}

std::string describe_model_summary(const ModelSummary& summary) {
  std::ostringstream out;
  std::string dtypes;
  for (const auto& [name, count] : summary.dtypes) {
    dtypes += (dtypes.empty() ? "" : ", ") + name + (summary.dtypes.size() > 1 ? " " + with_commas(count) : "");
  }
  out << with_commas(summary.parameters) << " parameters (" << with_commas(summary.trainable) << " trainable"
      << (dtypes.empty() ? "" : ", " + dtypes) << ", " << byte_text(summary.parameter_bytes) << ")";
  if (summary.buffers > 0)
    out << ", buffers " << with_commas(summary.buffers) << " elements (" << byte_text(summary.buffer_bytes) << ")";
  size_t width = 0;
  for (const auto& part : summary.parts) width = std::max(width, part.name.size());
  for (const auto& part : summary.parts) {
    out << "\n  " << std::left << std::setw(static_cast<int>(width)) << part.name << std::right << std::setw(14)
        << with_commas(part.parameters);
    if (part.trainable != part.parameters) out << " (" << with_commas(part.trainable) << " trainable)";
  }
  return out.str();
}

}  // namespace ptrain::models
