// The processes of a bench, as command lines: ptrain's job (ptrain_job.cpp: `ptrain train`, under `ptrain
// launch` for the strategies of one process a device, after `ptrain estimate`) and PyTorch's
// (pytorch_job.cpp: bench/pytorch_reference.py, under torchrun likewise), with the files each leaves under
// the bench's --out. Internal to bench/.
#pragma once

#include <string>
#include <vector>

#include "ptrain/bench/vocabulary.h"
#include "ptrain/bench/suite.h"

namespace ptrain::bench {

// Where a PyTorch variant's records go under runs/: pytorch (eager), pytorch-compiled (the suite's compile
// mode), pytorch-compiled-MODE (compiled-MODE).
std::string pytorch_framework_of(const std::string& variant);
// FSDP's units as the PyTorch reference wraps its model (size-based, at least this many parameters), so
// that both frameworks shard the same units.
inline constexpr char kFsdpMinNumParams[] = "1000000";

// A word for /bin/sh: in single quotes, any ' within closed, escaped and reopened.
std::string quoted(const std::string& text);
std::string join_command(const std::vector<std::string>& words);

// A port nobody listens on now, for a run's rendezvous: benches (and tests) running side by side must not
// meet on a fixed default port.
int free_port();

// A job's files: its record under runs/<framework>/ by id (which holds the workload in a suite of several),
// its log and estimate in a folder per workload: out/folder[/workload].
std::string workload_folder(const std::string& out, const std::string& folder, const SuiteRun& run);
// The `ptrain train --config` file of the run's workload.
std::string workload_file_of(const std::string& out, const SuiteRun& run);
// The workload's value for key; empty when it has none.
std::string workload_value(const WorkloadKeys& workload, const std::string& key);
bool truthy(const std::string& value);  // YAML's true: true, yes, on, 1

// The arguments of the run's `ptrain train`, after the executable and "train".
std::vector<std::string> ptrain_train_arguments(const Suite& suite, const SuiteRun& run, const std::string& out,
                                                const std::string& metrics_path);
// Sets job.processes and job.replicas from its run: how it spreads over its devices.
void set_shape(BenchJob& job);

// What a job's files add to their names in its repeat-th round of --repeat: nothing in the first, so that a
// bench without --repeat (or one that continues it) keeps the records it had; ".repeat-K" in round K.
std::string repeat_suffix(int64_t repeat);

BenchJob ptrain_job(const Suite& suite, const SuiteRun& run, const BenchOptions& o, const std::string& out,
                    int64_t repeat = 1);
BenchJob pytorch_job(const Suite& suite, const SuiteRun& run, const std::string& variant, const BenchOptions& o,
                     const std::string& out, const PytorchAbilities& abilities, int64_t repeat = 1);

}  // namespace ptrain::bench
