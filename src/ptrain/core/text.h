// Small text tests and joins the library's parsers and messages share (C++17's std::string has no ends_with).
#pragma once

#include <string>
#include <vector>

namespace ptrain {

// Whether text ends with end ("" ends every text).
inline bool ends_with(const std::string& text, const std::string& end) {
  return text.size() >= end.size() && text.compare(text.size() - end.size(), end.size(), end) == 0;
}

// Cuts end off text where text ends with it and is longer (a suffix alone, "+offload", has nothing it qualifies);
// says whether it did.
inline bool remove_suffix(std::string& text, const std::string& end) {
  if (text.size() <= end.size() || !ends_with(text, end)) return false;
  text.resize(text.size() - end.size());
  return true;
}

// parts with separator between each two: join({"a", "b"}, ", ") is "a, b".
inline std::string join(const std::vector<std::string>& parts, const std::string& separator) {
  std::string text;
  for (size_t i = 0; i < parts.size(); ++i) text += (i ? separator : "") + parts[i];
  return text;
}

}  // namespace ptrain
