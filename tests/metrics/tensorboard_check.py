#!/usr/bin/env python3
"""Loads ptrain's --tensorboard event files with TensorBoard's own EventAccumulator and checks their tags.

    tensorboard_check.py DIR TAG=STEPS ... [--ptrain EXE ARGS...]

Each TAG=STEPS says that scalar tag TAG holds STEPS values (e.g. train/loss=4 eval/accuracy=2). With
--ptrain, the script first runs `EXE train ARGS... --tensorboard DIR` (a fresh DIR), so that CTest can run it
whole. Exits 77 (CTest's skip) when tensorboard cannot be imported, 1 when a check fails.
"""
import os
import shutil
import subprocess
import sys


def main(argv):
    if "--ptrain" in argv:
        at = argv.index("--ptrain")
        checks, command = argv[:at], argv[at + 1:]
    else:
        checks, command = argv, []
    if len(checks) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    directory, expected = checks[0], dict(item.rsplit("=", 1) for item in checks[1:])
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError as error:
        print(f"skipped: tensorboard is not importable by {sys.executable} ({error})")
        return 77
    if command:
        shutil.rmtree(directory, ignore_errors=True)
        run = subprocess.run([command[0], "train", *command[1:], "--tensorboard", directory],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if run.returncode != 0:
            print(run.stdout)
            print(f"ptrain exited {run.returncode}", file=sys.stderr)
            return 1
    files = sorted(name for name in os.listdir(directory) if "tfevents" in name)
    if not files:
        print(f"{directory}: no event file", file=sys.stderr)
        return 1
    accumulator = EventAccumulator(directory, size_guidance={"scalars": 0})  # 0: keep every value
    accumulator.Reload()
    tags = accumulator.Tags()["scalars"]
    failures = []
    for tag, count in expected.items():
        if tag not in tags:
            failures.append(f"tag {tag} missing (tags: {sorted(tags)})")
            continue
        events = accumulator.Scalars(tag)
        if len(events) != int(count):
            failures.append(f"{tag}: {len(events)} values, expected {count}")
        steps = [e.step for e in events]
        if steps != sorted(steps) or any(e.wall_time <= 0 for e in events):
            failures.append(f"{tag}: steps {steps} out of order or a wall time missing")
    print(f"{', '.join(files)}: {len(tags)} scalar tags: " + ", ".join(f"{t} x{len(accumulator.Scalars(t))}" for t in sorted(tags)))
    for failure in failures:
        print(failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
