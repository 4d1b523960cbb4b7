#!/usr/bin/env python3
"""check_kernel_tiers.py on small trees made here (downward includes pass, upward ones fail), then on the real
tree (argv[1], the project's root)."""

import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

CHECKER = Path(__file__).with_name("check_kernel_tiers.py")
PROJECT_ROOT = None

DOWNWARD = {
    "src/ptrain/kernels/cuda/launch.h": "#pragma once\n",
    "src/ptrain/kernels/cuda/batch_norm.cu": '#include "ptrain/kernels/cuda/launch.h"\n',
    "src/ptrain/kernels/batch_norm_params.h": "#pragma once\n",
    "src/ptrain/kernels/fused.h": '#include "ptrain/kernels/batch_norm_params.h"\n',
    "src/ptrain/kernels/fused_cuda.cpp": '#include "ptrain/kernels/cuda/launch.h"\n#include "ptrain/kernels/fused.h"\n',
    "src/ptrain/kernels/batch_norm_relu.h": '#include "ptrain/kernels/batch_norm_params.h"\n',
    "src/ptrain/kernels/batch_norm_relu.cpp": '#include "ptrain/kernels/batch_norm_relu.h"\n#include "ptrain/kernels/fused.h"\n',
}


def run_checker(files):
    with tempfile.TemporaryDirectory() as root:
        for relative, text in files.items():
            path = Path(root) / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        return subprocess.run([sys.executable, str(CHECKER), root], capture_output=True, text=True)


class Checker(unittest.TestCase):
    def test_downward_includes_pass(self):
        result = run_checker(DOWNWARD)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertEqual(result.stdout, "")

    def test_the_tensor_tier_including_a_public_header_fails_naming_both(self):
        tree = dict(DOWNWARD)
        tree["src/ptrain/kernels/fused.h"] = '#pragma once\n#include "ptrain/kernels/batch_norm_relu.h"\n'
        result = run_checker(tree)
        self.assertEqual(result.returncode, 1, result.stdout)
        self.assertIn("src/ptrain/kernels/fused.h:2: includes ptrain/kernels/batch_norm_relu.h", result.stdout)
        self.assertIn("public functions (tier 2), from the tensor-level kernels (tier 1)", result.stdout)

    def test_a_launcher_including_the_tensor_tier_fails(self):
        tree = dict(DOWNWARD)
        tree["src/ptrain/kernels/cuda/batch_norm.cu"] = '#include "ptrain/kernels/fused.h"\n'
        result = run_checker(tree)
        self.assertEqual(result.returncode, 1, result.stdout)
        self.assertIn("src/ptrain/kernels/cuda/batch_norm.cu:1: includes ptrain/kernels/fused.h", result.stdout)

    def test_a_root_without_kernels_is_an_error_not_a_pass(self):
        result = run_checker({"README.md": "x\n"})
        self.assertEqual(result.returncode, 2)

    def test_ptrain_itself_includes_its_kernel_tiers_downward(self):
        result = subprocess.run([sys.executable, str(CHECKER), str(PROJECT_ROOT)], capture_output=True, text=True)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)


if __name__ == "__main__":
    PROJECT_ROOT = Path(sys.argv.pop(1))
    unittest.main()
