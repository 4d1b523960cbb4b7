#!/usr/bin/env python3
"""Writes the ctest entries of one GoogleTest binary (run after each link of it, as gtest_discover_tests is).

Usage: gtest_entries.py --binary B --name N --out FILE [--labels L...] [--slow PATTERN...] [--gpu PATTERN...]
                        [--per-case] [--case-cost C] [--case-costs Suite.Case=C...] [--cuda-build] [--working-dir D] [--environment VAR=VALUE...]

Starting a test process costs about 0.65 s of CPU (LibTorch's start-up) whatever the case does, so cases are
grouped into few processes:
  - N.fast: one process for the binary's quick in-process cases (label fast);
  - N.<source>[.K]: the other cases of a source, a few per entry, each in a child forked for it from a parent
    that runs none (the binary's --ptrain_fork_each_case, tests/support/test_main.cpp), so that they share one
    start-up and each starts clean: the cases matching a --slow pattern (long numerics), those of a source
    that forks processes (it includes multiprocess.h or sharded_harness.h: forked ranks need a parent that did
    no LibTorch work yet) or reads the process's peak RSS (which earlier cases of one process would have
    raised; a fork starts VmHWM and ru_maxrss again at the child's size), and every case under --per-case (the
    CLI tests, each running the executable for seconds); label slow, or the binary's own --labels under
    --per-case;
  - one entry per case, named Suite.Case, for the cases of a --per-case binary matching a --case-costs
    pattern (long end-to-end runs, started first);
  - on a CPU build, N.gpu_only: one process for the cases that skip without a CUDA device (label gpu), those
    whose first statement is PTRAIN_REQUIRE_CUDA_KERNELS() (or another PTRAIN_REQUIRE_..CUDA/GPU..() macro) or
    `if (!torch::cuda::is_available()) GTEST_SKIP()`, and those matching a --gpu pattern; it shows each skip's
    reason, and fails if one of them ran anyway (it was then wrongly taken for a GPU-only case). On a CUDA
    build those cases get one entry each (label gpu).
PATTERN is a gtest filter pattern (Suite.Case, Suite.*, *Word*). Every case the binary lists is in exactly
one entry; DISABLED_ cases get an entry each marked DISABLED, as gtest_discover_tests gives them.

It also writes OUT's _per_case.cmake twin: every case in its own process with the same labels, as before
the grouping, which ctest reads instead when PTRAIN_TEST_PROCESS_PER_CASE=1 is in its environment.
"""

import argparse
import fnmatch
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

# gtest's lines for a case that passed and one that skipped, as ctest regular expressions in CMake brackets.
PASSED_CASE = "[=[\\[       OK \\]]=]"
SKIPPED_CASE = "[=[\\[  SKIPPED \\]]=]"
# What makes a source's cases need a clean process each: forked ranks (multiprocess.h, sharded_harness.h),
# whose parent must have done no LibTorch work yet (a forked child each), and reads of the process's peak RSS
# (getrusage's ru_maxrss, /proc's VmHWM), which an earlier case of the same process would have raised already
# (a process each).
FORKS_RANKS = re.compile(r'#include\s+"(multiprocess\.h|sharded_harness\.h)"')
READS_PEAK_RSS = re.compile(r'getrusage|host_peak_rss_bytes\(\)')
# A case that needs a CUDA device says so in its first statement: PTRAIN_REQUIRE_CUDA_KERNELS(), a macro of that
# kind (PTRAIN_REQUIRE_FP8_GPU()), or if (!torch::cuda::is_available()) GTEST_SKIP() << ...
NEEDS_CUDA = re.compile(r"^\s*(PTRAIN_REQUIRE_\w*(CUDA|GPU)\w*\(\)|if\s*\(\s*!\s*torch::cuda::is_available\(\)\s*\)\s*GTEST_SKIP\(\))")


def listed_cases(binary, working_dir, timeout):
    """[(suite, case, file, line, value_param)] in the binary's order."""
    with tempfile.TemporaryDirectory(prefix="ptrain-gtest-list-") as scratch:
        listing = Path(scratch) / "list.json"
        result = subprocess.run([binary, "--gtest_list_tests", f"--gtest_output=json:{listing}"], cwd=working_dir,
                                capture_output=True, text=True, timeout=timeout)
        if result.returncode != 0 or not listing.exists():
            sys.exit(f"gtest_entries.py: {binary} --gtest_list_tests failed ({result.returncode}):\n"
                     f"{result.stdout}{result.stderr}")
        data = json.loads(listing.read_text())
    cases = []
    for suite in data["testsuites"]:
        for case in suite["testsuite"]:
            cases.append((suite["name"], case["name"], case.get("file", ""), case.get("line", 0), case.get("value_param")))
    return cases


def source_matches(source, pattern):
    return any(pattern.search(line) for line in source_lines(source))


def source_lines(source, seen={}):
    if source not in seen:
        try:
            seen[source] = Path(source).read_text(errors="replace").splitlines()
        except OSError:
            seen[source] = []
    return seen[source]


def needs_cuda(source, line):
    """Whether the case whose TEST macro is at source:line starts by skipping without a CUDA device."""
    text = "\n".join(source_lines(source)[max(0, line - 1):line + 4])
    body = text[text.find("{") + 1:] if "{" in text else ""
    return bool(NEEDS_CUDA.match(body))


def matches(full_name, patterns):
    return any(fnmatch.fnmatchcase(full_name, pattern) for pattern in patterns)


def bracket(text):
    """text as a CMake bracket argument."""
    equals = "="
    while f"]{equals}]" in text:
        equals += "="
    return f"[{equals}[{text}]{equals}]"


def case_entry_name(suite, case, value_param):
    """gtest_discover_tests' name for a case: Suite.Case, a value-parameterised one ending /<its value>."""
    if value_param is not None:
        return f"{suite}.{re.sub(r'/[0-9]+$', '', case)}/{value_param}"
    return f"{suite}.{case}"


def group_filter(members, cases_of_suite):
    """A --gtest_filter running exactly members: Suite.* for a whole suite, its cases by name otherwise."""
    by_suite = {}
    for suite, case in members:
        by_suite.setdefault(suite, []).append(case)
    parts = []
    for suite, cases in by_suite.items():
        if len(cases) == len(cases_of_suite[suite]):
            parts.append(f"{suite}.*")
        else:
            parts.extend(f"{suite}.{case}" for case in cases)
    return ":".join(parts)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--labels", nargs="*", default=[])
    parser.add_argument("--slow", nargs="*", default=[])
    parser.add_argument("--gpu", nargs="*", default=[])
    parser.add_argument("--per-case", action="store_true")
    parser.add_argument("--cuda-build", action="store_true")
    parser.add_argument("--case-cost", type=float, default=0)
    # Cases that take much longer than the others get their own COST, so that a fresh build starts them first.
    parser.add_argument("--case-costs", nargs="*", default=[])
    parser.add_argument("--working-dir", default=os.getcwd())
    parser.add_argument("--environment", nargs="*", default=[])
    args = parser.parse_args()

    cases = listed_cases(args.binary, args.working_dir, 120)
    cases_of_suite = {}
    for suite, case, _, _, _ in cases:
        cases_of_suite.setdefault(suite, []).append(case)

    case_costs = {}
    for item in args.case_costs:
        pattern, _, cost = item.rpartition("=")
        case_costs[pattern] = float(cost)

    # Each case's kind: "fast" (grouped), "gpu" (grouped on a CPU build), "forked" (grouped by source, a child
    # forked for each case), "" (an entry of its own: a --case-costs case of a --per-case binary), "disabled".
    kinds = []
    sources = {}
    for suite, case, source, line, value_param in cases:
        full = f"{suite}.{case}"
        sources[(suite, case)] = source
        if suite.startswith("DISABLED_") or case.startswith("DISABLED_"):
            kind = "disabled"
        elif matches(full, args.gpu) or needs_cuda(source, line):
            kind = "gpu"
        elif args.per_case:
            kind = "" if matches(full, list(case_costs)) else "forked"
        elif matches(full, args.slow) or source_matches(source, READS_PEAK_RSS) or source_matches(source, FORKS_RANKS):
            kind = "forked"
        else:
            kind = "fast"
        kinds.append((suite, case, value_param, kind))
    unmatched = [p for p in args.slow + args.gpu + list(case_costs) if not any(fnmatch.fnmatchcase(f"{s}.{c}", p) for s, c, _, _, _ in cases)]
    if unmatched:
        sys.exit(f"gtest_entries.py: {args.binary}: no case matches {' '.join(unmatched)} (renamed or removed?)")

    own = [args.name] + args.labels

    def add(lines, name, argv, labels, extra=""):
        lines.append(f"add_test({bracket(name)} {bracket(args.binary)} {' '.join(bracket(a) for a in argv)})")
        environment = f" ENVIRONMENT {bracket(';'.join(args.environment))}" if args.environment else ""
        lines.append(f"set_tests_properties({bracket(name)} PROPERTIES WORKING_DIRECTORY {bracket(args.working_dir)} "
                     f"LABELS {bracket(';'.join(dict.fromkeys(labels)))}{environment}{extra})")

    def add_case(lines, suite, case, value_param, kind):
        name = case_entry_name(suite, case, value_param)
        labels = own + ([kind] if kind and kind != "disabled" else [])
        if kind == "disabled":
            add(lines, name, [f"--gtest_filter={suite}.{case}", "--gtest_also_run_disabled_tests"], labels, " DISABLED TRUE")
            return
        own_cost = next((c for p, c in case_costs.items() if matches(f"{suite}.{case}", [p])), args.case_cost)
        cost = f" COST {own_cost:g}" if own_cost else ""
        # A case that skips (no gloo, no CUDA device) shows as skipped, as under gtest_discover_tests.
        add(lines, name, [f"--gtest_filter={suite}.{case}"], labels, f" SKIP_REGULAR_EXPRESSION {SKIPPED_CASE}{cost}")

    grouped = []
    fast = [(s, c) for s, c, _, kind in kinds if kind == "fast"]
    if fast:
        # COST: ctest starts the costliest entries first when it has no timings yet (a fresh build).
        add(grouped, f"{args.name}.fast", [f"--gtest_filter={group_filter(fast, cases_of_suite)}"], own + ["fast"],
            f" COST {max(1, len(fast) // 4)}")
    gpu_only = [(s, c) for s, c, _, kind in kinds if kind == "gpu"]
    if gpu_only and not args.cuda_build:
        add(grouped, f"{args.name}.gpu_only", [f"--gtest_filter={group_filter(gpu_only, cases_of_suite)}"],
            own + ["gpu"], f" FAIL_REGULAR_EXPRESSION {PASSED_CASE}")
    # The forked cases of a source, a few per entry, so that ctest -j still spreads them over the cores: CLI
    # cases run the executable for seconds each, the others for about one.
    by_source = {}
    for suite, case, _, kind in kinds:
        if kind == "forked":
            by_source.setdefault(sources[(suite, case)], []).append((suite, case))
    per_entry = 6 if args.per_case else 16
    for source, members in by_source.items():
        count = -(-len(members) // per_entry)
        chunks = [members[i * len(members) // count:(i + 1) * len(members) // count] for i in range(count)]
        stem = Path(source).stem if source else "cases"
        for index, chunk in enumerate(chunks):
            name = f"{args.name}.{stem}" + (f".{index + 1}" if len(chunks) > 1 else "")
            cost = len(chunk) * (args.case_cost or 1)
            add(grouped, name, ["--ptrain_fork_each_case", f"--gtest_filter={group_filter(chunk, cases_of_suite)}"],
                own + ([] if args.per_case else ["slow"]), f" COST {cost:g}")
    for suite, case, value_param, kind in kinds:
        if kind not in ("fast", "gpu", "forked") or (kind == "gpu" and args.cuda_build):
            add_case(grouped, suite, case, value_param, kind)
    Path(args.out).write_text("\n".join(grouped) + "\n")

    # One process per case, as gtest_discover_tests registers them (PTRAIN_TEST_PROCESS_PER_CASE=1 ctest ...):
    # to tell whether a grouped case fails because of an earlier one in its process, and to time the difference.
    per_case = []
    for suite, case, value_param, kind in kinds:
        # A forked case alone: as before the grouping, the binary's own labels under --per-case, else slow.
        alone = ("" if args.per_case else "slow") if kind == "forked" else kind
        add_case(per_case, suite, case, value_param, alone)
    Path(per_case_file(args.out)).write_text("\n".join(per_case) + "\n")


def per_case_file(out):
    return re.sub(r"\.cmake$", "", out) + "_per_case.cmake"

if __name__ == "__main__":
    main()
