#!/usr/bin/env python3
"""Fails when a lower tier of src/ptrain/kernels/ includes a header of a higher one.

The folder has three tiers, each built on the ones below it:
  0. cuda/ and cudnn/: the launchers on raw device pointers, compiled without LibTorch's headers;
  1. fused.h (with its halves fused_cuda.cpp and fused_none.cpp) and batch_norm_params.h: the kernels on tensors;
  2. every other file: the public functions (batch_norm_relu.h, cross_entropy.h, ...), which choose between the
     kernels and LibTorch's reference.
A lower tier including a higher one's header makes the two one unit again: a change to a public signature
recompiles the launchers, and nothing keeps the public functions' vocabulary out of the kernels.

Usage: check_kernel_tiers.py ROOT. Prints one line per violation (file, line, the included header, both tiers)
and exits 1 when there is any; exits 2 when ROOT has no src/ptrain/kernels.
"""

import re
import sys
from pathlib import Path

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]ptrain/kernels/([^">]+)[">]')
SOURCE_SUFFIXES = (".h", ".hpp", ".cpp", ".cu", ".cuh")
TIER_NAMES = ("raw-pointer launchers", "tensor-level kernels", "public functions")


def tier(relative):
    """The tier of a path below src/ptrain/kernels/."""
    parts = Path(relative).parts
    if parts[0] in ("cuda", "cudnn"):
        return 0
    name = parts[-1]
    if name in ("fused.h", "fused_cuda.cpp", "fused_none.cpp", "batch_norm_params.h"):
        return 1
    return 2


def violations(root):
    kernels = Path(root) / "src" / "ptrain" / "kernels"
    for path in sorted(p for p in kernels.rglob("*") if p.suffix in SOURCE_SUFFIXES and p.is_file()):
        relative = path.relative_to(kernels)
        own = tier(relative)
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            match = INCLUDE.match(line)
            if match and tier(match.group(1)) > own:
                included = tier(match.group(1))
                yield (f"src/ptrain/kernels/{relative}:{number}: includes ptrain/kernels/{match.group(1)}, a header of "
                       f"the {TIER_NAMES[included]} (tier {included}), from the {TIER_NAMES[own]} (tier {own})")


def main(argv):
    if len(argv) != 2:
        print("usage: check_kernel_tiers.py ROOT", file=sys.stderr)
        return 2
    if not (Path(argv[1]) / "src" / "ptrain" / "kernels").is_dir():
        print(f"check_kernel_tiers.py: {argv[1]} has no src/ptrain/kernels", file=sys.stderr)
        return 2
    found = list(violations(argv[1]))
    for line in found:
        print(line)
    if found:
        print(f"{len(found)} include(s) of a higher tier of kernels/", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
