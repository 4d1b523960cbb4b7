#include "ptrain/config/help_format.h"

#include <sstream>
#include <vector>

namespace ptrain::config {

namespace {

constexpr size_t kIndent = 2;
constexpr size_t kDescriptionColumn = 32;

std::vector<std::string> words_of(const std::string& text) {
  std::vector<std::string> words;
  std::istringstream in(text);
  for (std::string word; in >> word;) words.push_back(word);
  return words;
}

// Text and a column to its left: on the head's line when the head leaves room, else on the lines below.
std::string two_columns(const std::string& head, const std::string& text) {
  std::string out = std::string(kIndent, ' ') + head;
  if (text.empty()) return out + "\n";
  if (kIndent + head.size() + 2 <= kDescriptionColumn) {
    out += std::string(kDescriptionColumn - kIndent - head.size(), ' ');
  } else {
    out += "\n" + std::string(kDescriptionColumn, ' ');
  }
  return out + wrap_text(text, kDescriptionColumn, kDescriptionColumn) + "\n";
}

}  // namespace

std::string wrap_text(const std::string& text, size_t indent, size_t first_indent, size_t width) {
  std::string out;
  size_t column = first_indent;
  bool line_empty = true;
  for (const std::string& word : words_of(text)) {
    if (!line_empty && column + 1 + word.size() > width) {
      out += "\n" + std::string(indent, ' ');
      column = indent;
      line_empty = true;
    }
    if (!line_empty) {
      out += ' ';
      ++column;
    }
    out += word;
    column += word.size();
    line_empty = false;
  }
  return out;
}

std::string default_text(const CLI::Option& opt) {
  const std::string text = opt.get_default_str();
  return text.empty() || text == "[]" ? "unset" : text;
}

std::string HelpFormatter::make_option(const CLI::Option* opt, bool is_positional) const {
  return two_columns(make_option_name(opt, is_positional) + make_option_opts(opt), make_option_desc(opt));
}

std::string HelpFormatter::make_option_name(const CLI::Option* opt, bool is_positional) const {
  if (is_positional) return opt->get_name(true, false);
  // The names alone: CLI11 writes a negated flag as --x{false}, which reads as a default.
  std::string names;
  for (const auto& name : opt->get_snames()) names += (names.empty() ? "-" : ", -") + name;
  for (const auto& name : opt->get_lnames()) names += (names.empty() ? "--" : ", --") + name;
  return names;
}

std::string HelpFormatter::make_option_opts(const CLI::Option* opt) const {
  std::string opts;
  if (opt->get_type_size() != 0 && !opt->get_type_name().empty()) opts += " " + opt->get_type_name();
  if (opt->get_expected_max() == CLI::detail::expected_max_vector_size) opts += " ...";
  if (opt->get_required()) opts += " REQUIRED";
  return opts;
}

std::string HelpFormatter::make_option_desc(const CLI::Option* opt) const {
  std::string description = opt->get_description();
  const bool is_help = opt->get_lnames().size() == 1 && (opt->get_lnames()[0] == "help" || opt->get_lnames()[0] == "version");
  if (is_help || opt->get_positional()) return description;
  if (every_default_ || !opt->get_default_str().empty())
    description += (description.empty() ? "" : " ") + std::string("(default: ") + default_text(*opt) + ")";
  return description;
}

std::string HelpFormatter::make_description(const CLI::App* app) const {
  const std::string description = app->get_description();
  return description.empty() ? std::string() : wrap_text(description, 0, 0) + "\n";
}

std::string HelpFormatter::make_subcommand(const CLI::App* sub) const {
  return two_columns(sub->get_display_name(true), sub->get_description());
}

std::string HelpFormatter::make_footer(const CLI::App* app) const {
  const std::string footer = app->get_footer();
  return footer.empty() ? std::string() : wrap_text(footer, 0, 0) + "\n";
}

}  // namespace ptrain::config
