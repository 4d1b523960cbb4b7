#!/usr/bin/env python3
"""Sums the Triton kernels of a PyTorch profiler trace by kernel (the trailing number of each name dropped), per
step: where torch.compile's generated code spends the step.   triton_by_kernel.py TRACE.json STEPS"""
import collections
import json
import re
import sys

trace, steps = json.load(open(sys.argv[1])), int(sys.argv[2])
total, calls = collections.defaultdict(float), collections.Counter()
for e in trace["traceEvents"]:
    if e.get("cat") == "kernel" and e["name"].startswith("triton"):
        name = re.sub(r"_\d+$", "", e["name"])
        total[name] += e["dur"] / steps / 1000
        calls[name] += 1
for name, ms in sorted(total.items(), key=lambda kv: -kv[1]):
    print(f"{ms:7.3f} ms  x{calls[name] // steps:3d}  {name}")
print(f"{sum(total.values()):7.3f} ms  all Triton kernels a step")
