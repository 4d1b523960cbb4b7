#!/usr/bin/env python3
"""Each steady figure of a quick bench beside the same run at 300 steps.

    python3 compare.py QUICK_RUNS_DIR LONG_RUNS_DIR

Both are a bench's runs/ folder (runs/ptrain/*.json, runs/pytorch/*.json). For every record in LONG_RUNS_DIR with
a record of the same path in QUICK_RUNS_DIR: both steady throughputs, their ratio, and whether the quick one is
within 5% of the long one (issue 49's bar). Exits 1 when one is not, 2 when no pair was found.
"""
import json
import pathlib
import sys


def records(folder):
    root = pathlib.Path(folder)
    out = {}
    for path in sorted(root.rglob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and "epochs_detail" in record:
            out[str(path.relative_to(root))] = record
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    quick, long = records(sys.argv[1]), records(sys.argv[2])
    pairs = 0
    worst = 0.0
    print(f"{'run':44} {'steps':>9} {'quick img/s':>12} {'300 img/s':>10} {'quick/300':>9}  within 5%")
    for name, record in long.items():
        if name not in quick:
            continue
        q = quick[name].get("steady_images_per_second")
        l = record.get("steady_images_per_second")
        if not q or not l:
            print(f"{name:44} no steady figure (quick {q}, long {l})")
            continue
        pairs += 1
        ratio = q / l
        worst = max(worst, abs(ratio - 1.0))
        steps = f"{quick[name].get('steps', '?')}/{record.get('steps', '?')}"
        print(f"{name:44} {steps:>9} {q:12,.0f} {l:10,.0f} {ratio:9.3f}  {'yes' if abs(ratio - 1) <= 0.05 else 'NO'}")
    if pairs == 0:
        print("no run is in both folders")
        sys.exit(2)
    print(f"{pairs} pairs; the largest difference {100 * worst:.1f}%")
    sys.exit(0 if worst <= 0.05 else 1)


if __name__ == "__main__":
    main()
