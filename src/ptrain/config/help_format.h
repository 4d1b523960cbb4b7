// How `ptrain ... --help` lays out its options: every line within kHelpWidth columns, descriptions
// wrapped under their column, and each option's default said in words, "(default: X)", from the value
// the option is bound to when it is added (so the defaults of TrainConfig appear once, in its header).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace ptrain::config {

constexpr size_t kHelpWidth = 100;

class HelpFormatter : public CLI::Formatter {
 public:
  // every_default: also say "(default: unset)" for options whose bound value is empty; otherwise only
  // options with a default text show one.
  explicit HelpFormatter(bool every_default = false) : every_default_(every_default) {}

  std::string make_option(const CLI::Option* opt, bool is_positional) const override;
  std::string make_option_name(const CLI::Option* opt, bool is_positional) const override;
  std::string make_option_opts(const CLI::Option* opt) const override;
  std::string make_option_desc(const CLI::Option* opt) const override;
  std::string make_description(const CLI::App* app) const override;
  std::string make_subcommand(const CLI::App* sub) const override;
  std::string make_footer(const CLI::App* app) const override;

 private:
  bool every_default_;
};

// The text help gives as an option's default: its captured default, "unset" for an empty one.
std::string default_text(const CLI::Option& opt);

// text broken at spaces into lines of at most width columns, each after indent spaces, the first line
// after first_indent instead (for text that continues a line already started).
std::string wrap_text(const std::string& text, size_t indent, size_t first_indent, size_t width = kHelpWidth);

}  // namespace ptrain::config
