// A failed run's summary line is the failing process's own error line, found in its log: not the launcher's
// "rank 0 (pid N) exited with code 2", not torchrun's "=====".
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "ptrain/bench/failure_line.h"
#include "ptrain/bench/runner.h"
#include "test_support.h"

namespace ptrain::bench {
namespace {

using ptrain::testing::TempDir;

// torchrun (python3-torch 1.13, --redirects 1 --tee 1) of two workers raising, as it prints it: the workers'
// tracebacks, then torchrun's own ending in ChildFailedError and its report framed in "=====".
const char* kTorchrunRaising = R"($ 'python3' '-m' 'torch.distributed.run' '--nproc_per_node' '2' 'bench/pytorch_reference.py'
WARNING:__main__:
*****************************************
Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your system being overloaded, please further tune the variable for optimal performance in your application as needed. 
*****************************************
Traceback (most recent call last):
  File "/tmp/wtb_tr/fail.py", line 9, in <module>
    raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB
[default0]:epoch 1 starting
[default1]:epoch 1 starting
ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 0 (pid: 15506) of binary: /usr/bin/python3
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/usr/lib/python3/dist-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 346, in wrapper
    return f(*args, **kwargs)
           ^^^^^^^^^^^^^^^^^^
  File "/usr/lib/python3/dist-packages/torch/distributed/launcher/api.py", line 246, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
fail.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-02_01:00:51
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 15507)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-02_01:00:51
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 15506)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
)";

TEST(FailureLine, TorchrunsWorkerExceptionNotItsReport) {
  EXPECT_EQ(failure_line(kTorchrunRaising), "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB");
}

TEST(FailureLine, ArgparsesErrorUnderTorchrun) {
  const std::string log = std::string(R"(usage: pytorch_reference.py [-h] [--mode MODE]
pytorch_reference.py: error: --warmup-epochs 0.5 (or --warmup-steps) is longer than the whole run
[default0]:epoch 1 starting
ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 2) local_rank: 0 (pid: 15532) of binary: /usr/bin/python3
Traceback (most recent call last):
  File "/usr/lib/python3/dist-packages/torch/distributed/launcher/api.py", line 246, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
pytorch_reference.py FAILED
============================================================
)");
  EXPECT_EQ(failure_line(log),
            "pytorch_reference.py: error: --warmup-epochs 0.5 (or --warmup-steps) is longer than the whole run");
}

// torch 2.x prefixes the workers' teed lines with "[rankN]:"; a traceback of one rank interleaved with the
// other's lines still ends in its exception.
TEST(FailureLine, PrefixedTracebacksOfInterleavedRanks) {
  const char* log = R"([rank1]:Traceback (most recent call last):
[rank0]:epoch 1/5 step 10
[rank1]:  File "bench/pytorch_reference.py", line 1200, in main
[rank0]:epoch 1/5 step 20
[rank1]:    loss.backward()
[rank1]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB
E1201 12:00:00.000000 1234 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 1
============================================================
)";
  EXPECT_EQ(failure_line(log), "[rank1]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB");
}

// Two workers of torchrun 1.13 raising together with PYTHONUNBUFFERED=1: their tracebacks reach the one log a
// few characters at a time, so caret lines lose their indentation ("^^^ ^^^^^^^^^^^^") and frames are torn.
// The exception line is the summary, never a piece of a frame or its carets.
TEST(FailureLine, TornTracebacksOfTwoUnbufferedWorkersGiveTheException) {
  const char* log = R"(Traceback (most recent call last):
Traceback (most recent call last):
  File "bench/pytorch_reference.py", line 1290, in <module>
  File "bench/pytorch_reference.py", line 1290, in <module>
    main()
    main()
  File "bench/pytorch_reference.py", line 1040, in main
    model.load_state_dict(torch.load(a.weights))
                          ^^^^^^^^^^^^^^^^^^^^^^^
  File "bench/pytorch_reference.py", line 1040, in main
    model.load_state_dict(torch.load(a.weights))
               ^^^
^^^ ^^^^^^^^^^^^
  File "/usr/lib/python3/dist-packages/torch/serialization.py", line 1002, in _legacy_load
magic_number = pickle_module.load(f, **pickle_load_args)
    magic_number = pickle_module.load(f, **pickle_load_args)
                   ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
 ^^^^^^^^^^^^^ ^^^^^^^^^^^^^^^^^^^^^^^^
_pickle.UnpicklingError: invalid load key, 'n'.
_pickle.UnpicklingError: invalid load key, 'n'.
ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 0 (pid: 15506) of binary: /usr/bin/python3
Traceback (most recent call last):
  File "/usr/lib/python3/dist-packages/torch/distributed/launcher/api.py", line 246, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
)";
  EXPECT_EQ(failure_line(log), "_pickle.UnpicklingError: invalid load key, 'n'.");
  // A bare exception class ends a traceback too; a torn bare word does not.
  EXPECT_EQ(failure_line("Traceback (most recent call last):\n  File \"a.py\", line 1\nmain\n^^^^\nKeyboardInterrupt\n"),
            "KeyboardInterrupt");
}

// ptrain launch: the rank the launcher names as the one that failed speaks, not a rank stopped after it.
TEST(FailureLine, TheFailedRanksErrorUnderPtrainLaunch) {
  const char* log = R"($ '/bin/ptrain' 'launch' '--nproc-per-node' '2' '--' '/bin/ptrain' 'train'
[rank 0] model resnet20
[rank 1] model resnet20
[rank 1] ptrain: error: --weights /data/w.pt: not a checkpoint (no such key 'fc.weight')
[rank 0] ptrain: error: interrupted (signal 15)
ptrain launch: rank 1 (pid 4242) exited with code 2; stopped the other ranks
)";
  EXPECT_EQ(failure_line(log), "[rank 1] ptrain: error: --weights /data/w.pt: not a checkpoint (no such key 'fc.weight')");
  EXPECT_EQ(failure_line("ptrain: LibTorch error: mat1 and mat2 shapes cannot be multiplied\n"),
            "ptrain: LibTorch error: mat1 and mat2 shapes cannot be multiplied");
}

TEST(FailureLine, WithoutAnErrorLineTheLastOwnLineThatIsNoSeparator) {
  EXPECT_EQ(failure_line("epoch 1 starting\nSegmentation fault (core dumped)\n=====\n\n"),
            "Segmentation fault (core dumped)");
  EXPECT_EQ(failure_line("[rank 0] epoch 1\nptrain launch: rank 0 (pid 7) exited with code 139; stopped the other ranks\n"),
            "[rank 0] epoch 1");
  EXPECT_EQ(failure_line("=====\n"), "=====");
  EXPECT_EQ(failure_line(""), "");
}

// Through the bench: a run that fails after it started (its plan is fine; its weights file is not) is
// summarised by its processes' own error lines, ptrain's under ptrain launch and PyTorch's under torchrun.
TEST(FailureLine, ABenchsFailedRunsCarryTheirProcessesErrorLines) {
  TempDir dir;
  std::ofstream(dir.file("weights.pt")) << "not a checkpoint";
  std::ofstream(dir.file("suite.yaml")) << "name: broken\nworkload: {model: resnet20, dataset: synthetic, data-path: "
                                           "\"64:1x8x8:4\", batch-size: 8, epochs: 1, test-limit: 8, threads: 1, weights: "
                                        << dir.file("weights.pt") << "}\nruns:\n  - {precision: fp32, strategy: ddp, devices: 2}\n";
  BenchOptions o;
  o.suite = dir.file("suite.yaml");
  o.source_dir = PTRAIN_SOURCE_DIR;
  o.out_dir = dir.file("out");
  o.gpus = 0;
  o.estimate = false;
  o.pytorch = true;
  o.python = PTRAIN_ORACLE_PYTHON;
  o.ptrain_executable = PTRAIN_EXECUTABLE;
  std::ostringstream progress;
  const BenchOutcome outcome = run_bench(o, progress);
  ASSERT_EQ(outcome.failures.size(), 2u) << progress.str();
  const std::string& ptrain = outcome.failures[0];
  EXPECT_EQ(ptrain.rfind("ptrain fp32, ddp, 2 devices: exit status 2: [rank ", 0), 0u) << ptrain;
  EXPECT_NE(ptrain.find("] ptrain: "), std::string::npos) << ptrain;
  EXPECT_EQ(ptrain.find("exited with code"), std::string::npos) << ptrain;
  const std::string& pytorch = outcome.failures[1];
  EXPECT_EQ(pytorch.rfind("pytorch fp32, ddp, 2 devices: exit status ", 0), 0u) << pytorch;
  EXPECT_NE(pytorch.find("UnpicklingError"), std::string::npos) << pytorch;
  EXPECT_EQ(pytorch.find("====="), std::string::npos) << pytorch;
}

}  // namespace
}  // namespace ptrain::bench
