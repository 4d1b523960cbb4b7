#!/usr/bin/env python3
"""check_cuda_build.py on small trees made here (a CPU half, its CUDA half, a .cu kernel, a CPU archive and
the compile_commands.json of their CPU build): what it must refuse and what it must let pass, then on the
real tree (argv[1], the project's root; argv[2], its build directory)."""

import json
import os
import shlex
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

CHECKER = Path(__file__).with_name("check_cuda_build.py")
SKIP = 77
PROJECT_ROOT = BUILD_DIR = None

SMALL = {
    "src/ptrain/core/core.h": "#pragma once\nnamespace ptrain::core { int twice(int x); }\n",
    "src/ptrain/core/core.cpp": '#include "ptrain/core/core.h"\nnamespace ptrain::core { int twice(int x) { return 2 * x; } }\n',
    "src/ptrain/kernels/fused.h": "#pragma once\nnamespace ptrain::kernels { int scaled(int x); }\n",
    "src/ptrain/kernels/fused_none.cpp": (
        '#include "ptrain/kernels/fused.h"\n#include "ptrain/core/core.h"\n'
        "namespace ptrain::kernels { int scaled(int x) { return core::twice(x); } }\n"),
    "src/ptrain/kernels/fused_cuda.cpp": (
        '#include "ptrain/kernels/fused.h"\n#include "ptrain/kernels/cuda/launch.h"\n#include "ptrain/core/core.h"\n'
        "#if !PTRAIN_WITH_CUDA\n#error compiled without PTRAIN_WITH_CUDA\n#endif\n"
        "namespace ptrain::kernels { int scaled(int x) { return cuda::launch_scale(core::twice(x)); } }\n"),
    "src/ptrain/kernels/cuda/launch.h": "#pragma once\nnamespace ptrain::kernels::cuda { int launch_scale(int x); }\n",
    "src/ptrain/kernels/cuda/scale.cu": (
        '#include "ptrain/kernels/cuda/launch.h"\n'
        "__global__ void scale_kernel(int* x) { *x *= 3; }\n"
        "namespace ptrain::kernels::cuda { int launch_scale(int x) { scale_kernel<<<1, 1>>>(nullptr); return x; } }\n"),
}


def make_tree(root, files):
    """The sources, a CPU build of core and kernels (objects in archives), and its compile_commands.json."""
    root = Path(root)
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    build = root / "build"
    entries = []
    cpu_halves = sorted(Path(relative).name for relative in files if relative.startswith("src/ptrain/kernels/")
                        and relative.endswith("_none.cpp"))
    for component, sources in (("core", ["core.cpp"]), ("kernels", cpu_halves)):
        folder = build / "src/ptrain" / component
        folder.mkdir(parents=True, exist_ok=True)
        objects = []
        for name in sources:
            source = root / "src/ptrain" / component / name
            if not source.exists():
                continue
            obj = folder / (name + ".o")
            command = ["c++", "-std=gnu++17", f"-I{root / 'src'}", "-Wall", "-O2", "-c", str(source), "-o", str(obj)]
            subprocess.run(command, check=True)
            entries.append({"directory": str(build), "file": str(source), "command": shlex.join(command)})
            objects.append(str(obj))
        subprocess.run(["ar", "rcs", str(folder / f"libptrain_{component}.a"), *objects], check=True)
    (build / "compile_commands.json").write_text(json.dumps(entries))
    return root, build


def run_checker(root, build, env=None):
    return subprocess.run([sys.executable, str(CHECKER), str(root), str(build)], capture_output=True, text=True,
                          env=env)



def with_a_second_pair_of_halves():
    """SMALL with a second _none/_cuda pair beside the first, both defining the same function."""
    tree = dict(SMALL)
    tree["src/ptrain/kernels/later_none.cpp"] = "namespace ptrain::kernels { int later() { return 1; } }\n"
    tree["src/ptrain/kernels/later_cuda.cpp"] = "namespace ptrain::kernels { int later() { return 2; } }\n"
    return tree

class Checker(unittest.TestCase):
    def check(self, files, env=None):
        with tempfile.TemporaryDirectory() as scratch:
            root, build = make_tree(scratch, files)
            result = run_checker(root, build, env)
        if env is None and result.returncode == SKIP:
            self.skipTest(result.stdout.strip())  # this machine lacks the CUDA toolkit or LibTorch's CUDA headers
        return result

    def test_halves_that_compile_and_define_what_is_called_pass(self):
        result = self.check(SMALL)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("1 .cu files, 1 CUDA halves", result.stdout)

    def test_a_function_only_the_cpu_half_defines_fails_naming_it_and_the_file(self):
        bad = dict(SMALL)
        bad["src/ptrain/kernels/fused_none.cpp"] += "namespace ptrain::kernels { int forgotten_on_gpu() { return 1; } }\n"
        result = self.check(bad)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertIn("ptrain::kernels::forgotten_on_gpu(): defined by src/ptrain/kernels/fused_none.cpp "
                      "but by no CUDA half or .cu file", result.stdout)

    def test_cpu_halves_compile_in_one_batch_and_a_lacking_function_names_its_own_half(self):
        two = with_a_second_pair_of_halves()
        result = self.check(two)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("1 .cu files, 2 CUDA halves", result.stdout)
        self.assertIn("3 of 3 compiles run", result.stdout)  # the .cu file, a batch of CUDA halves, one of CPU halves
        two["src/ptrain/kernels/later_none.cpp"] += "namespace ptrain::kernels { int forgotten_on_gpu() { return 1; } }\n"
        result = self.check(two)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertIn("ptrain::kernels::forgotten_on_gpu(): defined by src/ptrain/kernels/later_none.cpp "
                      "but by no CUDA half or .cu file", result.stdout)
        # Two halves that cannot share a batch (a helper of the same name in each) compile one by one.
        for name in ("fused_none.cpp", "later_none.cpp"):
            two[f"src/ptrain/kernels/{name}"] = ("namespace { [[maybe_unused]] int helper() { return 1; } }\n" +
                                                 two[f"src/ptrain/kernels/{name}"])
        two["src/ptrain/kernels/later_none.cpp"] = two["src/ptrain/kernels/later_none.cpp"].replace(
            "namespace ptrain::kernels { int forgotten_on_gpu() { return 1; } }\n", "")
        result = self.check(two)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("5 of 5 compiles run", result.stdout)  # .cu, CUDA batch, CPU batch, then its two halves alone

    def test_cuda_halves_compile_in_one_batch_and_a_broken_or_lacking_one_is_named(self):
        two = with_a_second_pair_of_halves()
        # A CUDA half that does not compile is named alone (its batch compiled member by member), the other not.
        broken = dict(two)
        broken["src/ptrain/kernels/later_cuda.cpp"] = "namespace ptrain::kernels { int later() { return missing; } }\n"
        result = self.check(broken)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertIn("src/ptrain/kernels/later_cuda.cpp does not compile as the CUDA build compiles it", result.stdout)
        self.assertIn("missing", result.stdout)
        self.assertNotIn("fused_cuda.cpp does not compile", result.stdout)
        # A function one _none half defines and neither CUDA half of the batch does: named with that _none half.
        lacking = dict(two)
        lacking["src/ptrain/kernels/fused_none.cpp"] += "namespace ptrain::kernels { int only_on_cpu() { return 1; } }\n"
        result = self.check(lacking)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertIn("ptrain::kernels::only_on_cpu(): defined by src/ptrain/kernels/fused_none.cpp "
                      "but by no CUDA half or .cu file", result.stdout)
        # What one CUDA half calls and only the other defines is defined for the CUDA build, batched or not.
        calls = dict(two)
        calls["src/ptrain/kernels/later_cuda.cpp"] = (
            "namespace ptrain::kernels { int scaled(int x); int later() { return scaled(2); } }\n")
        result = self.check(calls)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("3 of 3 compiles run", result.stdout)  # the .cu file, the two CUDA halves as one, the CPU halves as one
        # A function a CUDA half of the batch calls and nobody defines is still found.
        unresolved = dict(two)
        unresolved["src/ptrain/kernels/later_cuda.cpp"] = (
            "namespace ptrain::kernels { int nowhere(int x); int later() { return nowhere(2); } }\n")
        result = self.check(unresolved)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertIn("ptrain::kernels::nowhere(int): called by the CUDA build's sources, defined nowhere", result.stdout)

    def test_a_launcher_the_cu_files_do_not_define_fails(self):
        bad = dict(SMALL)
        bad["src/ptrain/kernels/cuda/launch.h"] += "namespace ptrain::kernels::cuda { int launch_shift(int x); }\n"
        bad["src/ptrain/kernels/fused_cuda.cpp"] = bad["src/ptrain/kernels/fused_cuda.cpp"].replace(
            "cuda::launch_scale(core::twice(x))", "cuda::launch_shift(cuda::launch_scale(x))")
        result = self.check(bad)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertIn("ptrain::kernels::cuda::launch_shift(int): called by the CUDA build's sources, defined nowhere",
                      result.stdout)

    def test_a_cuda_half_that_does_not_compile_fails_naming_it_with_the_compiler_message(self):
        bad = dict(SMALL)
        bad["src/ptrain/kernels/fused_cuda.cpp"] = bad["src/ptrain/kernels/fused_cuda.cpp"].replace(
            "core::twice(x)", "core::thrice(x)")
        result = self.check(bad)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertIn("src/ptrain/kernels/fused_cuda.cpp does not compile as the CUDA build compiles it", result.stdout)
        self.assertIn("thrice", result.stdout)

    def test_a_cu_file_that_does_not_compile_fails(self):
        bad = dict(SMALL)
        bad["src/ptrain/kernels/cuda/scale.cu"] = bad["src/ptrain/kernels/cuda/scale.cu"].replace("*x *= 3;", "*x *= y;")
        result = self.check(bad)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertIn("src/ptrain/kernels/cuda/scale.cu does not compile", result.stdout)

    def test_a_cpu_half_without_a_cuda_half_fails(self):
        bad = dict(SMALL)
        bad["src/ptrain/core/clock_none.cpp"] = "int unused;\n"
        result = self.check(bad)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertIn("src/ptrain/core/clock_none.cpp: no CUDA half beside it (clock_cuda.cpp or clock.cpp)",
                      result.stdout)

    def test_a_second_check_reuses_what_did_not_change_and_recompiles_what_did(self):
        with tempfile.TemporaryDirectory() as scratch:
            root, build = make_tree(scratch, SMALL)
            first = run_checker(root, build)
            if first.returncode == SKIP:
                self.skipTest(first.stdout.strip())
            self.assertEqual(first.returncode, 0, first.stdout + first.stderr)
            self.assertIn("3 of 3 compiles run", first.stdout)
            again = run_checker(root, build)
            self.assertEqual(again.returncode, 0, again.stdout + again.stderr)
            self.assertIn("0 of 3 compiles run", again.stdout)
            # A header only the CUDA half and the .cu file include: both recompile, and a break in it shows.
            launch = Path(root, "src/ptrain/kernels/cuda/launch.h")
            launch.write_text(launch.read_text() + "namespace ptrain::kernels::cuda { int unused_here(int x); }\n")
            changed = run_checker(root, build)
            self.assertEqual(changed.returncode, 0, changed.stdout + changed.stderr)
            self.assertIn("2 of 3 compiles run", changed.stdout)
            launch.write_text(launch.read_text() + "namespace ptrain::kernels::cuda { int broken( }\n")
            broken = run_checker(root, build)
            self.assertEqual(broken.returncode, 1, broken.stdout + broken.stderr)
            self.assertIn("does not compile", broken.stdout)

    def test_without_nvcc_it_skips_saying_why(self):
        env = dict(os.environ, NVCC="/nonexistent/nvcc")
        result = self.check(SMALL, env)
        self.assertEqual(result.returncode, SKIP, result.stdout + result.stderr)
        self.assertIn("skipped: no nvcc", result.stdout)

    def test_ptrain_s_cuda_sources_compile_and_link_here(self):
        result = run_checker(PROJECT_ROOT, BUILD_DIR)
        if result.returncode == SKIP:
            self.skipTest(result.stdout.strip())
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)


if __name__ == "__main__":
    BUILD_DIR = Path(sys.argv.pop(2))
    PROJECT_ROOT = Path(sys.argv.pop(1))
    unittest.main()
