// Small text tests the library's parsers share (C++17's std::string has no ends_with).
#pragma once

#include <string>

namespace ptrain {

// Whether text ends with end ("" ends every text).
inline bool ends_with(const std::string& text, const std::string& end) {
  return text.size() >= end.size() && text.compare(text.size() - end.size(), end.size(), end) == 0;
}

}  // namespace ptrain
