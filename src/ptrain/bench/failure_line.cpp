#include "ptrain/bench/failure_line.h"

#include <cctype>
#include <map>
#include <optional>
#include <vector>

namespace ptrain::bench {

namespace {

// A line with the rank prefix a launcher put on it taken off: "[rank 1] text" (ptrain launch), "[rank1]: text"
// (torchrun 2.x), "[1]:text" or "[default1]:text" (torchrun 1.x). The body keeps its indentation, which
// tells a traceback's frames from its exception.
struct Line {
  std::string_view text;  // the whole line
  std::string_view body;
  std::string prefix;     // empty: none
  std::optional<int> rank;
};

Line parse_line(std::string_view text) {
  Line line{text, text, "", std::nullopt};
  if (text.empty() || text.front() != '[') return line;
  const auto close = text.find(']');
  if (close == std::string_view::npos || close > 16) return line;
  const std::string_view inside = text.substr(1, close - 1);
  size_t digits = inside.size();
  while (digits > 0 && std::isdigit(static_cast<unsigned char>(inside[digits - 1]))) --digits;
  const std::string_view name = inside.substr(0, digits);
  if (digits == inside.size() || !(name.empty() || name == "rank" || name == "rank " || name == "default")) return line;
  size_t body = close + 1;
  if (body < text.size() && text[body] == ':') ++body;
  if (body < text.size() && text[body] == ' ') ++body;
  line.body = text.substr(body);
  line.prefix = std::string(text.substr(0, close + 1));
  line.rank = std::stoi(std::string(inside.substr(digits)));
  return line;
}

bool starts_with(std::string_view text, std::string_view start) { return text.substr(0, start.size()) == start; }
bool contains(std::string_view text, std::string_view part) { return text.find(part) != std::string_view::npos; }

// "ptrain: error: ...", "ptrain: LibTorch error: ...", argparse's "prog.py: error: ...".
bool is_error_line(std::string_view body) {
  for (size_t at = body.find("error: "); at != std::string_view::npos; at = body.find("error: ", at + 1)) {
    if (at == 0 || body[at - 1] == ' ' || body[at - 1] == ':') return true;
  }
  return false;
}

bool is_separator(std::string_view body) {
  for (const char c : body) {
    if (std::isalnum(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// The line ending a Python traceback: "RuntimeError: ...", "_pickle.UnpicklingError: ...",
// "torch.OutOfMemoryError: ...", a bare "KeyboardInterrupt": a (dotted) class name, capitalised as exception
// classes are. Two processes writing unbuffered to one log (PYTHONUNBUFFERED=1 writes a traceback a piece at
// a time) tear each other's lines: a caret line of Python 3.11 ("^^^ ^^^^") or a frame can lose its
// indentation, and only this shape tells the exception from those pieces.
bool is_exception_line(std::string_view body) {
  size_t end = 0, last_part = 0;
  while (end < body.size() &&
         (std::isalnum(static_cast<unsigned char>(body[end])) || body[end] == '_' || body[end] == '.')) {
    if (body[end] == '.') last_part = end + 1;
    ++end;
  }
  if (last_part >= end || !std::isupper(static_cast<unsigned char>(body[last_part]))) return false;
  if (end == body.size()) {
    const std::string_view name = body.substr(last_part);
    for (const std::string_view ending : {"Error", "Exception", "Interrupt", "Exit"}) {
      if (name.size() > ending.size() && name.substr(name.size() - ending.size()) == ending) return true;
    }
    return false;
  }
  return body.substr(end, 2) == ": " || body.substr(end) == ":";
}

// The launcher's and torchrun's own words about the failure, which name no reason.
bool is_failure_report(std::string_view body) {
  return starts_with(body, "ptrain launch: ") || contains(body, "ChildFailedError") ||
         contains(body, "distributed.elastic") || contains(body, "distributed/elastic");
}

// "ptrain launch: rank 1 (pid 123) exited with code 2; ..." or "ptrain launch: rank 1 exited with code 2".
std::optional<int> failed_rank_of(std::string_view body) {
  constexpr std::string_view kStart = "ptrain launch: rank ";
  if (!starts_with(body, kStart) || !contains(body, "exited with code")) return std::nullopt;
  size_t end = kStart.size();
  while (end < body.size() && std::isdigit(static_cast<unsigned char>(body[end]))) ++end;
  if (end == kStart.size()) return std::nullopt;
  return std::stoi(std::string(body.substr(kStart.size(), end - kStart.size())));
}

std::string_view trimmed(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  return text;
}

}  // namespace

std::string failure_line(std::string_view log) {
  std::vector<Line> lines;
  for (size_t start = 0; start < log.size();) {
    size_t end = log.find('\n', start);
    if (end == std::string_view::npos) end = log.size();
    std::string_view text = log.substr(start, end - start);
    if (!text.empty() && text.back() == '\r') text.remove_suffix(1);
    lines.push_back(parse_line(text));
    start = end + 1;
  }

  std::vector<const Line*> errors;
  std::optional<int> failed_rank;
  const Line* plain = nullptr;       // the last line of the process's own, not a separator
  const Line* last = nullptr;        // the last non-empty line
  bool report_started = false;       // torchrun's report of a failure: nothing after it is a worker's
  std::map<std::string, bool> in_traceback;  // per prefix: the lines of different ranks interleave
  for (const Line& line : lines) {
    if (trimmed(line.body).empty()) continue;
    last = &line;
    if (const auto rank = failed_rank_of(line.body)) failed_rank = rank;
    bool& traceback = in_traceback[line.prefix];
    if (line.body == "Traceback (most recent call last):") {
      traceback = true;
      continue;
    }
    if (traceback) {
      // A frame, its source line, its carets (torn from their indentation by another process's output).
      if (std::isspace(static_cast<unsigned char>(line.body.front())) || is_separator(line.body)) continue;
      if (is_exception_line(line.body)) {
        traceback = false;
        if (contains(line.body, "ChildFailedError")) {
          report_started = true;  // torchrun's own traceback, reporting that a worker failed
        } else {
          errors.push_back(&line);
        }
        continue;
      }
      // A torn piece of a frame, or a line of another process: the exception is still to come.
    }
    if (is_error_line(line.body)) {
      errors.push_back(&line);
      continue;
    }
    if (is_failure_report(line.body)) report_started = report_started || !starts_with(line.body, "ptrain launch: ");
    if (!report_started && !is_failure_report(line.body) && !is_separator(line.body)) plain = &line;
  }
  const Line* chosen = nullptr;
  for (const Line* error : errors) {
    if (!failed_rank || error->rank == failed_rank) chosen = error;
  }
  if (!chosen && !errors.empty()) chosen = errors.back();
  if (!chosen) chosen = plain ? plain : last;
  return chosen ? std::string(trimmed(chosen->text)) : std::string();
}

}  // namespace ptrain::bench
