#!/usr/bin/env python3
"""check_component_includes.py on small source trees made here: what it must refuse and what it must let pass,
then on the real tree (argv[1], the project's root)."""

import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

CHECKER = Path(__file__).with_name("check_component_includes.py")
PROJECT_ROOT = None


def run_checker(root):
    return subprocess.run([sys.executable, str(CHECKER), str(root)], capture_output=True, text=True)


def write_tree(root, files):
    for relative, text in files.items():
        path = Path(root) / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


# Three layers: base, middle over base, top over middle. Each file includes what its DEPS allow.
LAYERED = {
    "src/ptrain/base/CMakeLists.txt": "ptrain_component(NAME base SOURCES base.cpp)\n",
    "src/ptrain/base/base.h": "#pragma once\n",
    "src/ptrain/base/base.cpp": '#include "ptrain/base/base.h"\n',
    "src/ptrain/middle/CMakeLists.txt": (
        "if(PTRAIN_WITH_CUDA)\n  set(device middle_device_cuda.cpp)\nelse()\n  set(device middle_device_none.cpp)\nendif()\n"
        "# a comment naming DEPS top must not count\n"
        "ptrain_component(NAME middle_spec SOURCES spec.cpp DEPS base)\n"
        "ptrain_component(NAME middle\n  SOURCES middle.cpp ${device}\n  DEPS base middle_spec\n  LIBS zlib)\n"),
    "src/ptrain/middle/spec.h": '#include "ptrain/base/base.h"\n',
    "src/ptrain/middle/spec.cpp": '#include "ptrain/middle/spec.h"\n',
    "src/ptrain/middle/middle.h": '#include "ptrain/middle/spec.h"\n',
    "src/ptrain/middle/middle_device.h": "#pragma once\n",
    "src/ptrain/middle/middle_device_none.cpp": '#include "ptrain/middle/middle_device.h"\n#include "ptrain/base/base.h"\n',
    "src/ptrain/middle/middle.cpp": '#include "ptrain/middle/middle.h"\n#include <ptrain/base/base.h>\n',
    "src/ptrain/top/CMakeLists.txt": "ptrain_component(NAME top SOURCES top.cpp DEPS base middle middle_spec)\n",
    "src/ptrain/top/top.cpp": '#include "ptrain/middle/middle.h"\n#include "ptrain/middle/spec.h"\n',
}


class Checker(unittest.TestCase):
    def check(self, files):
        with tempfile.TemporaryDirectory() as root:
            write_tree(root, files)
            return run_checker(root)

    def test_a_tree_whose_includes_follow_its_deps_passes(self):
        result = self.check(LAYERED)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertEqual(result.stdout, "")

    def test_a_lower_component_including_a_higher_ones_header_fails_naming_file_header_and_deps(self):
        bad = dict(LAYERED)
        bad["src/ptrain/base/base.cpp"] = '#include "ptrain/base/base.h"\n\n#include "ptrain/top/top.h"\n'
        bad["src/ptrain/top/top.h"] = "#pragma once\n"
        result = self.check(bad)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertEqual(result.stdout.splitlines(), [
            "src/ptrain/base/base.cpp:3: includes ptrain/top/top.h (component top), "
            "but the DEPS of component base name only: nothing"])

    def test_a_component_reached_only_through_another_ones_deps_must_be_named(self):
        # top uses middle_spec's header; middle names middle_spec, top does not: the include is refused.
        bad = dict(LAYERED)
        bad["src/ptrain/top/CMakeLists.txt"] = "ptrain_component(NAME top SOURCES top.cpp DEPS base middle)\n"
        result = self.check(bad)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertIn("src/ptrain/top/top.cpp:2: includes ptrain/middle/spec.h (component middle_spec), "
                      "but the DEPS of component top name only: base middle", result.stdout)

    def test_a_build_specific_half_belongs_to_the_component_that_lists_it(self):
        # middle_device_none.cpp is listed through ${device}; as middle's, it may not include top.
        bad = dict(LAYERED)
        bad["src/ptrain/middle/middle_device_none.cpp"] = '#include "ptrain/top/top.h"\n'
        bad["src/ptrain/top/top.h"] = "#pragma once\n"
        result = self.check(bad)
        self.assertEqual(result.returncode, 1)
        self.assertIn("the DEPS of component middle name only: base middle_spec", result.stdout)

    def test_deps_naming_no_component_fail(self):
        bad = dict(LAYERED)
        bad["src/ptrain/top/CMakeLists.txt"] = "ptrain_component(NAME top SOURCES top.cpp DEPS base middle middle_spec mid)\n"
        result = self.check(bad)
        self.assertEqual(result.returncode, 1)
        self.assertIn("component top names DEPS mid, which no ptrain_component declares", result.stdout)

    def test_a_tree_without_components_is_an_error_not_a_pass(self):
        result = self.check({"src/ptrain/base/base.h": "#pragma once\n"})
        self.assertEqual(result.returncode, 2)
        self.assertIn("no ptrain_component", result.stderr)

    def test_the_runs_parts_may_not_include_the_config_though_their_component_may(self):
        tree = {
            "src/ptrain/config/CMakeLists.txt": "ptrain_component(NAME config SOURCES config.cpp)\n",
            "src/ptrain/config/config.h": "#pragma once\n",
            "src/ptrain/config/config.cpp": '#include "ptrain/config/config.h"\n',
            "src/ptrain/train/CMakeLists.txt": "ptrain_component(NAME train SOURCES plan.cpp run/part.cpp DEPS config)\n",
            "src/ptrain/train/plan.cpp": '#include "ptrain/config/config.h"\n',
            "src/ptrain/train/run/part.cpp": '#include "ptrain/train/plan.h"\n',
            "src/ptrain/train/plan.h": "#pragma once\n",
        }
        self.assertEqual(self.check(tree).returncode, 0, self.check(tree).stdout)
        tree["src/ptrain/train/run/part.cpp"] = '#include "ptrain/train/plan.h"\n#include "ptrain/config/config.h"\n'
        result = self.check(tree)
        self.assertEqual(result.returncode, 1)
        self.assertIn("src/ptrain/train/run/part.cpp:2: includes ptrain/config/config.h", result.stdout)
        self.assertIn("no file under src/ptrain/train/run/ may include it", result.stdout)

    def test_the_runs_parts_may_not_reach_the_config_through_the_headers_they_include(self):
        tree = {
            "src/ptrain/config/CMakeLists.txt": "ptrain_component(NAME config SOURCES config.cpp)\n",
            "src/ptrain/config/config.h": "#pragma once\n",
            "src/ptrain/config/config.cpp": '#include "ptrain/config/config.h"\n',
            "src/ptrain/train/CMakeLists.txt": (
                "ptrain_component(NAME train SOURCES plan.cpp schedule.cpp run/part.cpp DEPS config)\n"),
            "src/ptrain/train/plan.h": '#include "ptrain/train/schedule.h"\n',
            "src/ptrain/train/plan.cpp": '#include "ptrain/train/plan.h"\n#include "ptrain/config/config.h"\n',
            "src/ptrain/train/schedule.h": '#pragma once\n#include "ptrain/train/schedule.h"\n',
            "src/ptrain/train/schedule.cpp": '#include "ptrain/train/schedule.h"\n#include "ptrain/config/config.h"\n',
            "src/ptrain/train/run/part.cpp": '#include "ptrain/train/plan.h"\n',
        }
        result = self.check(tree)
        self.assertEqual(result.returncode, 0, result.stdout)  # a header including itself ends the search
        tree["src/ptrain/train/schedule.h"] = '#pragma once\n#include "ptrain/config/config.h"\n'
        result = self.check(tree)
        self.assertEqual(result.returncode, 1)
        self.assertEqual(result.stdout.splitlines(), [
            "src/ptrain/train/run/part.cpp:1: includes ptrain/train/plan.h, which includes ptrain/train/schedule.h -> "
            "ptrain/config/config.h (component config): no file under src/ptrain/train/run/ may include it, directly "
            "or through the headers it includes"])

    def test_ptrain_itself_includes_only_what_its_deps_name(self):
        result = run_checker(PROJECT_ROOT)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)


if __name__ == "__main__":
    PROJECT_ROOT = Path(sys.argv.pop(1))
    unittest.main()
