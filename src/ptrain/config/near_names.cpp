#include "ptrain/config/near_names.h"

#include <algorithm>
#include <tuple>

namespace ptrain::config {

size_t edit_distance(const std::string& a, const std::string& b) {
  // Optimal string alignment: Levenshtein plus the swap of two neighbouring letters, one edit.
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

std::vector<std::string> names_near(const std::string& given, const std::vector<std::string>& names) {
  const size_t allowed = given.size() <= 3 ? 1 : given.size() <= 6 ? 2 : 3;
  std::vector<std::tuple<size_t, std::string>> near;
  for (const auto& name : names) {
    if (name == given) continue;
    const size_t distance = edit_distance(given, name);
    const bool extends = given.size() >= 4 && name.rfind(given + "-", 0) == 0;
    if (distance <= allowed || extends) near.emplace_back(extends ? std::min(distance, allowed) : distance, name);
  }
  std::sort(near.begin(), near.end());
  near.erase(std::unique(near.begin(), near.end()), near.end());
  std::vector<std::string> out;
  for (size_t i = 0; i < near.size() && i < 3; ++i) out.push_back(std::get<1>(near[i]));
  return out;
}

std::string did_you_mean(const std::string& given, const std::vector<std::string>& names, const std::string& prefix) {
  const auto near = names_near(given, names);
  if (near.empty()) return "";
  std::string text = " (did you mean ";
  for (size_t i = 0; i < near.size(); ++i)
    text += (i == 0 ? "" : i + 1 == near.size() ? " or " : ", ") + prefix + near[i];
  return text + "?)";
}

}  // namespace ptrain::config
