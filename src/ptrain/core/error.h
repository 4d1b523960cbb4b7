// ptrain's one exception type. Its message names what was wrong and where: the file, key or flag,
// so that a user can fix the input without reading the source.
#pragma once

#include <stdexcept>
#include <string>

namespace ptrain {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws ptrain::Error when cond is false. Cheap enough for input validation; not for the training step.
inline void check(bool cond, const std::string& message) {
  if (!cond) throw Error(message);
}

}  // namespace ptrain
