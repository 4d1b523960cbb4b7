// Nothing outside the spec and the factories compares strategy or precision names: code asks
// StrategySpec and PrecisionPolicy what a strategy or mode does. This test reads src/ for comparisons of
// the names as string literals (==, !=, find/rfind/compare of a prefix, CLI11 lists written out) and for
// names edited as text ("amp-" + ..., ... + "+master").
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "ptrain/precision/policy.h"
#include "ptrain/strategy_spec/strategy_spec.h"

namespace ptrain::strategies {
namespace {

namespace fs = std::filesystem;

// Where names are parsed or turned into objects: the one table of each.
const std::set<std::string> kSpecAndFactories{
    "src/ptrain/strategy_spec/strategy_spec.cpp",
    "src/ptrain/strategies/factory.cpp",
    "src/ptrain/precision/policy.cpp",
};

// Files still comparing names while they move to StrategySpec: none left; a new entry needs a reason.
const std::set<std::string> kNotYetConverted{};

std::string alternatives() {
  std::vector<std::string> names = StrategySpec::names();
  for (const auto& n : StrategySpec::fsdp_sharding_names()) names.push_back(n);
  for (const auto& n : precision::precision_names()) names.push_back(n);
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : "|") + std::regex_replace(n, std::regex("-"), "\\-");
  return out;
}

std::vector<std::string> comparisons_in(const fs::path& file) {
  const std::string names = alternatives();
  const std::regex compared("(==|!=)\\s*\"(" + names + ")\"|\"(" + names + ")\"\\s*(==|!=)");
  // Prefix tests of a name ("zero" for the ZeRO stages, "hybrid" for fsdp's hybrid shardings, "amp-").
  const std::regex prefix("(rfind|find|compare|starts_with)\\(\\s*\"(zero|hybrid|amp\\-)\"");
  const std::regex listed("IsMember\\(\\{\\s*\"(" + names + ")\"");
  const std::regex edited("\"amp\\-\"\\s*\\+|\\+\\s*\"\\+master\"");
  // A DeepSpeed JSON key that happens to be spelled like a mode ("fp16": {...}) is a key, not a mode.
  const std::regex json_key("\\bkey\\s*==\\s*\"");
  std::vector<std::string> found;
  std::ifstream in(file);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const auto code = line.substr(0, line.find("//"));
    std::string rest = code;
    bool hit = std::regex_search(code, prefix) || std::regex_search(code, listed) || std::regex_search(code, edited);
    for (std::smatch m; !hit && std::regex_search(rest, m, compared); rest = m.suffix().str()) {
      const std::string before = m.prefix().str();
      if (!std::regex_search(before.substr(before.size() > 8 ? before.size() - 8 : 0) + m.str(), json_key)) hit = true;
    }
    if (hit) found.push_back(std::to_string(number) + ": " + line);
  }
  return found;
}

TEST(NameComparisons, NoStrategyOrPrecisionNameIsComparedOutsideTheSpecAndFactories) {
  const fs::path root = PTRAIN_SOURCE_DIR;
  ASSERT_TRUE(fs::is_directory(root / "src/ptrain")) << root;
  std::string report;
  size_t files = 0;
  for (const auto& entry : fs::recursive_directory_iterator(root / "src")) {
    const auto ext = entry.path().extension();
    if (!entry.is_regular_file() || (ext != ".cpp" && ext != ".h" && ext != ".cu")) continue;
    const std::string relative = fs::relative(entry.path(), root).generic_string();
    ++files;
    if (kSpecAndFactories.count(relative) || kNotYetConverted.count(relative)) continue;
    for (const auto& hit : comparisons_in(entry.path())) report += relative + ":" + hit + "\n";
  }
  EXPECT_GT(files, 50u);
  EXPECT_EQ(report, "") << "ask StrategySpec (strategy_spec/strategy_spec.h) or the PrecisionPolicy instead:\n" << report;
}

// The search itself finds what it is meant to: the comparisons this project had.
TEST(NameComparisons, TheSearchFindsTheFormsItLooksFor) {
  const fs::path file = fs::temp_directory_path() / ("ptrain_name_comparisons_" + std::to_string(::getpid()) + ".cpp");
  std::ofstream(file) << "if (c.run.strategy == \"zero3\") {}\n"
                         "const bool sharded = strategy.rfind(\"zero\", 0) == 0;\n"
                         "if (\"fsdp\" != name) {}\n"
                         "if (sharding == \"no-shard\") {}\n"
                         "if (mode == \"amp-bf16\") {}\n"
                         "app.check(CLI::IsMember({\"single\", \"dp\"}));\n"
                         "set(\"precision\", \"amp-\" + mixed_precision);\n"
                         "record.precision = name + \"+master\";\n"
                         "} else if (key == \"fp16\") {\n"
                         "// strategy == \"ddp\" in a comment\n"
                         "if (spec.shards_parameters()) {}\n";
  const auto found = comparisons_in(file);
  fs::remove(file);
  ASSERT_EQ(found.size(), 8u);
  EXPECT_EQ(found.front().substr(0, 2), "1:");
  EXPECT_EQ(found.back().substr(0, 2), "8:");
}

}  // namespace
}  // namespace ptrain::strategies
