// What a bench keeps in its --out beside the runs' own output: bench.json (how it ran: the suite, the
// workload, the command of every job), the workload files its runs read, and the run records it finds
// there, so that a bench with the same --out continues where the last one stopped. Internal to bench/.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ptrain/bench/vocabulary.h"
#include "ptrain/bench/suite.h"
#include "ptrain/metrics/run_record.h"

namespace ptrain::bench {

// Writes the `ptrain train --config` file of each of the suite's workloads under out and reads it back as
// `ptrain train` will: a bad key (from the suite file or a --set) is a ptrain::Error naming the file and
// the key before any run starts.
void write_workload_files(const Suite& suite, const std::string& out);

// Records kept from an earlier bench count as done only when that bench trained the same workload: throws
// ptrain::Error listing the keys that differ when bench_record (an earlier bench.json) holds another one.
void check_same_workload(const Suite& suite, const std::string& bench_record);

void write_bench_record(const Suite& suite, const BenchOptions& o, const std::vector<BenchJob>& jobs,
                        const std::string& path);

// The job's record when it is there and whole, and for a compiled job compiled in the job's mode; nullopt
// otherwise (half a file from an interrupted run, a record of another torch.compile mode).
std::optional<metrics::RunRecord> finished_record(const BenchJob& job);

// Puts the prediction `ptrain estimate` made for the run's strategy into the run's record (extra.estimate),
// where the report finds it. A missing or unreadable estimate leaves the record as it is.
void attach_estimate(const BenchJob& job);

// The machine's load average over 1, 5 and 15 minutes (/proc/loadavg); empty where the system has none.
std::vector<double> load_average();

// Puts into the run's record (extra.bench) its round under --repeat, the load averages read just before the run
// started and just after it ended, and the machine's cores, where the report finds why a figure is noisy. A
// record that cannot be read stays as it is.
void attach_bench_context(const BenchJob& job, const std::vector<double>& load_before,
                          const std::vector<double>& load_after);

// "12 s, 850 img/s, test accuracy 91.20%, peak 3.10 GiB per GPU"
std::string summary_of(const metrics::RunRecord& r);

}  // namespace ptrain::bench
