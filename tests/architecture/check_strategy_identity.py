#!/usr/bin/env python3
"""Fails when too much code outside src/ptrain/strategies/ (and src/ptrain/strategy_spec/, the table of strategies
itself) asks which strategy runs.

What a strategy can do is a capability query on strategies::StrategySpec (shards_parameters(),
takes_reduce_dtype(), ...) or a field of its descriptor row (strategies::descriptor()); code that names a
strategy instead (StrategyKind::x, is_fsdp(), is_zero(), zero_stage(), spec.is(...)) has to change when a
strategy is added. A few such lines are legitimate (accelerate's distributed_type names a strategy); more than
LIMIT are not.

Usage: check_strategy_identity.py ROOT [LIMIT]. Scans the C++ sources under ROOT/src/ptrain and ROOT/apps,
except ROOT/src/ptrain/strategies/ and ROOT/src/ptrain/strategy_spec/; comment lines do not count. Prints the count and, above LIMIT (10), every
offending line as file:line: text, and exits 1; exits 2 when ROOT has no src/ptrain.
"""

import re
import sys
from pathlib import Path

LIMIT = 10
IDENTITY = re.compile(r"StrategyKind::|\bis_fsdp\(\)|\bis_zero\(\)|\bzero_stage\(\)|(?:\.|->)is\(")
SOURCE_SUFFIXES = (".h", ".hpp", ".cpp", ".cu", ".cuh")


def identity_lines(root):
    root = Path(root)
    exempt = [root / "src" / "ptrain" / folder for folder in ("strategies", "strategy_spec")]
    found = []
    for top in (root / "src" / "ptrain", root / "apps"):
        if not top.is_dir():
            continue
        for path in sorted(top.rglob("*")):
            if path.suffix not in SOURCE_SUFFIXES or not path.is_file() or any(folder in path.parents for folder in exempt):
                continue
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if line.lstrip().startswith("//"):
                    continue
                if IDENTITY.search(line):
                    found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    return found


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = Path(argv[1])
    limit = int(argv[2]) if len(argv) > 2 else LIMIT
    if not (root / "src" / "ptrain").is_dir():
        print(f"check_strategy_identity.py: {root} has no src/ptrain", file=sys.stderr)
        return 2
    found = identity_lines(root)
    print(f"{len(found)} lines outside src/ptrain/strategies/ and strategy_spec/ ask which strategy runs (at most {limit})")
    if len(found) <= limit:
        return 0
    print("ask StrategySpec's capabilities or strategies::descriptor() instead; the lines:")
    for line in found:
        print("  " + line)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
