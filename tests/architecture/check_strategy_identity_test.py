#!/usr/bin/env python3
"""check_strategy_identity.py on small source trees made here (at the limit, above it, inside strategies/,
comments), then on the real tree (argv[1], the project's root)."""

import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

CHECKER = Path(__file__).with_name("check_strategy_identity.py")
PROJECT_ROOT = None


def run_checker(root, *extra):
    return subprocess.run([sys.executable, str(CHECKER), str(root), *map(str, extra)], capture_output=True, text=True)


def tree_with(files):
    root = tempfile.TemporaryDirectory()
    for relative, text in files.items():
        path = Path(root.name) / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def asking(count, start=0):
    forms = ["if (spec.is_fsdp()) x();", "k = StrategyKind::ddp;", "if (s.is_zero()) y();", "n = s.zero_stage();",
             "if (spec.is(k)) z();", "if (p->is(k)) z();"]
    return "".join(forms[(start + i) % len(forms)] + "\n" for i in range(count))


class Checker(unittest.TestCase):
    def test_ten_lines_outside_strategies_pass(self):
        with tree_with({"src/ptrain/a/a.cpp": asking(6), "apps/b.cpp": asking(4, 2)}) as root:
            result = run_checker(root)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("10 lines", result.stdout)

    def test_an_eleventh_line_fails_and_every_line_is_named(self):
        with tree_with({"src/ptrain/a/a.cpp": asking(6), "src/ptrain/b/b.h": asking(5, 3)}) as root:
            result = run_checker(root)
        self.assertEqual(result.returncode, 1, result.stdout)
        self.assertIn("11 lines", result.stdout)
        self.assertIn("src/ptrain/a/a.cpp:1: if (spec.is_fsdp()) x();", result.stdout)
        self.assertIn("src/ptrain/b/b.h:5: k = StrategyKind::ddp;", result.stdout)
        for form in ("StrategyKind::ddp", "s.is_zero()", "s.zero_stage()", "spec.is(k)", "p->is(k)"):
            self.assertIn(form, result.stdout)

    def test_strategies_comments_and_other_names_do_not_count(self):
        files = {"src/ptrain/strategies/factory.cpp": asking(30), "src/ptrain/strategy_spec/strategy_spec.cpp": asking(30),
                 "src/ptrain/a/a.cpp": "// spec.is_fsdp() in a comment\n  // StrategyKind::ddp\n"
                                       "if (spec.takes_fsdp_options() || this_is(x) || s.is_open()) w();\n",
                 "src/ptrain/a/notes.md": asking(30)}
        with tree_with(files) as root:
            result = run_checker(root, 0)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("0 lines", result.stdout)

    def test_a_root_without_sources_is_an_error_not_a_pass(self):
        with tree_with({"README.md": "x\n"}) as root:
            result = run_checker(root)
        self.assertEqual(result.returncode, 2)

    def test_ptrain_itself_asks_at_most_ten_times(self):
        result = run_checker(PROJECT_ROOT)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)


if __name__ == "__main__":
    PROJECT_ROOT = Path(sys.argv.pop(1))
    unittest.main()
