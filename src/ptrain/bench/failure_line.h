// What a failed run's log says went wrong, for the bench's one-line summary of it: the log of a
// `ptrain launch` run ends with the launcher's "rank 0 (pid N) exited with code 2", and one of torchrun with
// its failure report framed in "=====", while the reason is a line the failing process wrote before.
#pragma once

#include <string>
#include <string_view>

namespace ptrain::bench {

// The line of a run's output (stdout and stderr together) that says why it failed, as written:
//  - the last error line: ptrain's "ptrain: error: ..." (and "LibTorch error:"), a Python argparse "prog: error:
//    ...", or the exception ending a Python traceback (torchrun's ChildFailedError aside, which only reports
//    that a worker failed); of the rank `ptrain launch` names as the one that failed, where it names one and
//    that rank wrote one;
//  - without any, the last line that is neither a separator (=====, -----) nor the launcher's or torchrun's
//    report of the failure;
//  - without that either, the last non-empty line; empty for an empty log.
// Lines may carry a rank's prefix ("[rank 1] " from ptrain launch, "[rank1]: " or "[1]:" from torchrun).
std::string failure_line(std::string_view log);

}  // namespace ptrain::bench
