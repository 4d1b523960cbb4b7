// "Did you mean": the known names a mistyped one is a few edits from, for errors that name a key or a
// flag nobody defined (a letter missing, extra, changed, or two swapped).
#pragma once

#include <string>
#include <vector>

namespace ptrain::config {

// Edits (insertions, deletions, substitutions, swaps of neighbours) between a and b.
size_t edit_distance(const std::string& a, const std::string& b);

// The names close to given, closest first (at most three): within 1 edit of a name of up to 3
// characters, 2 up to 6, 3 beyond; or names that extend given ("warmup" -> "warmup-epochs").
std::vector<std::string> names_near(const std::string& given, const std::vector<std::string>& names);

// " (did you mean X?)" or " (did you mean X or Y?)", each name after prefix ("--"); "" when none is near.
std::string did_you_mean(const std::string& given, const std::vector<std::string>& names, const std::string& prefix = "");

}  // namespace ptrain::config
