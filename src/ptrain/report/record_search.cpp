// Record search for the report: every run record below some directories, named by its path there.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "ptrain/report/report.h"
#include "ptrain/core/error.h"

namespace ptrain::report {

namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  check(in.good(), "cannot read run record " + path.string());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The directory's own name, for telling apart runs of the same name in different --runs directories.
std::string directory_name(const std::string& dir) {
  fs::path path = fs::absolute(dir).lexically_normal();
  if (path.filename().empty()) path = path.parent_path();
  return path.filename().string();
}

}  // namespace

std::vector<ReportRun> read_runs(const std::vector<std::string>& run_dirs, std::vector<std::string>* skipped) {
  check(!run_dirs.empty(), "no run directory given");
  std::vector<ReportRun> runs;
  std::vector<std::string> not_records;
  std::vector<std::string> directory_of_run;
  for (const auto& dir : run_dirs) {
    std::error_code error;
    check(fs::is_directory(dir, error), "run directory " + dir + " does not exist or is not a directory");
    std::vector<fs::path> files;
    for (auto it = fs::recursive_directory_iterator(dir, error); !error && it != fs::recursive_directory_iterator();
         it.increment(error)) {
      if (it->is_regular_file() && it->path().extension() == ".json") files.push_back(it->path());
    }
    check(!error, "cannot list run directory " + dir + ": " + error.message());
    check(!files.empty(), "run directory " + dir + " holds no run record (*.json)");
    std::sort(files.begin(), files.end());
    const size_t runs_before = runs.size(), skipped_before = not_records.size();
    for (const auto& file : files) {
      nlohmann::json json;
      try {
        json = nlohmann::json::parse(read_file(file));
      } catch (const nlohmann::json::exception& e) {
        throw Error(file.string() + ": not valid JSON: " + e.what());
      }
      // Every run record has both keys, whichever tool wrote it; a file without them is not one gone wrong.
      if (!json.is_object() || !json.contains("schema_version") || !json.contains("epochs_detail")) {
        not_records.push_back(file.string() + " (not a run record: no schema_version and epochs_detail keys)");
        continue;
      }
      ReportRun run;
      try {
        run.record = metrics::run_record_from_json(json);
      } catch (const Error& e) {
        throw Error(file.string() + ": " + e.what());
      }
      run.name = file.lexically_relative(dir).replace_extension().string();
      run.source = file.string();
      run.logged_steps = read_step_log(step_log_path_of(run.source));
      runs.push_back(std::move(run));
      directory_of_run.push_back(directory_name(dir));
    }
    if (runs.size() == runs_before) {
      std::string left_out;
      for (size_t i = skipped_before; i < not_records.size(); ++i) left_out += (left_out.empty() ? "" : "; ") + not_records[i];
      throw Error("run directory " + dir + " holds no run record (*.json): " + left_out);
    }
  }
  if (skipped) *skipped = std::move(not_records);
  std::map<std::string, int> uses;
  for (const auto& run : runs) ++uses[run.name];
  for (size_t i = 0; i < runs.size(); ++i) {
    if (uses[runs[i].name] > 1) runs[i].name = directory_of_run[i] + "/" + runs[i].name;
  }
  return runs;
}

}  // namespace ptrain::report
