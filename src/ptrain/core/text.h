// Small text tests the library's parsers share (C++17's std::string has no ends_with).
#pragma once

#include <string>

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

}  // namespace ptrain
