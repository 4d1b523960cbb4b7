#!/usr/bin/env python3
"""Checks tests/support/test_main.cpp's --ptrain_fork_each_case, which most ctest entries run under.

Usage: test_main_self_test.py BINARY (test_main_self_test, built from test_main_self_test.cpp and test_main.cpp)."""
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

BINARY = None


def run(filter_, **env):
    with tempfile.TemporaryDirectory(prefix="ptrain-test-main-") as scratch:
        log = Path(scratch) / "log"
        process = subprocess.Popen([BINARY, "--ptrain_fork_each_case", f"--gtest_filter={filter_}"],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env={**os.environ, "PTRAIN_SELF_TEST_LOG": str(log), **env})
        output, _ = process.communicate(timeout=60)
        noted = [line.split() for line in log.read_text().splitlines()] if log.exists() else []
        return process.returncode, output, process.pid, noted


class ForkEachCase(unittest.TestCase):
    def test_each_case_runs_first_in_its_own_child_of_the_entrys_process(self):
        code, output, pid, noted = run("ForkEachCase.*")
        self.assertEqual(code, 0, output)
        self.assertEqual([name for name, *_ in noted], ["First", "Second", "Fails", "Crashes"], output)
        self.assertEqual(len({child for _, child, _, _ in noted}), 4, noted)
        for name, child, parent, order in noted:
            self.assertNotEqual(int(child), pid, name)
            self.assertEqual(int(parent), pid, name)
            self.assertEqual(order, "1", f"{name} ran after another case in its process")
        self.assertIn("4 cases, each in a process forked from this one: 4 passed, 0 failed", output)

    def test_a_failing_and_a_crashing_case_fail_the_entry_and_are_named(self):
        code, output, _, noted = run("ForkEachCase.*", PTRAIN_SELF_TEST_FAIL="1", PTRAIN_SELF_TEST_CRASH="1")
        self.assertEqual(code, 1, output)
        self.assertEqual(len(noted), 4, "a failure stopped the cases after it")
        self.assertIn("[ptrain] FAILED ForkEachCase.Fails (exit status 1)", output)
        self.assertIn("[ptrain] FAILED ForkEachCase.Crashes (killed by signal 6", output)
        self.assertIn("2 passed, 2 failed", output)

    def test_the_filter_selects_as_gtest_does(self):
        code, output, _, noted = run("ForkEachCase.*-*Fails:*Crashes", PTRAIN_SELF_TEST_FAIL="1", PTRAIN_SELF_TEST_CRASH="1")
        self.assertEqual(code, 0, output)
        self.assertEqual([name for name, *_ in noted], ["First", "Second"])
        code, output, _, noted = run("*Sec?nd:ForkEachCase.First")
        self.assertEqual((code, [name for name, *_ in noted]), (0, ["First", "Second"]), output)

    def test_a_filter_that_selects_nothing_fails(self):
        code, output, _, noted = run("NoSuchSuite.*")
        self.assertEqual((code, noted), (1, []), output)
        self.assertIn("selects no case", output)


if __name__ == "__main__":
    BINARY = sys.argv.pop(1)
    unittest.main()
