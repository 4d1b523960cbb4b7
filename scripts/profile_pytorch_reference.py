#!/usr/bin/env python3
"""The PyTorch reference (SGD workloads) under torch.profiler for steps 12-16: the GPU's span of each step
(the ProfilerStep range on the device), the time its kernels were busy within it, and the kernels that take the
most. A span well above the busy time means the GPU waited for the host. The host synchronises after every
step here, so the step's wall time is an upper bound. `--trace-out FILE` first also writes those steps as a
Chrome trace, which scripts/trace_summary.py sums by kernel family as it does ptrain's.

  python3 scripts/profile_pytorch_reference.py bench/pytorch_reference.py --data .data/cifar10 \\
      --precision amp-bf16 --channels-last --compile --fused-optimizer --max-steps 20 --epochs 1 \\
      --train-limit 2560 --test-limit 128 --no-eval
"""
import runpy
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile, schedule

trace_out = None
if len(sys.argv) > 2 and sys.argv[1] == "--trace-out":
    trace_out = sys.argv[2]
    del sys.argv[1:3]
script = sys.argv[1]
sys.argv = [script] + sys.argv[2:]
sys.path.insert(0, "bench")
WAIT, WARMUP, ACTIVE = 10, 1, 5  # steps 1-10 untraced, 11 traced and dropped, 12-16 kept
walls = []  # walls[i]: the end of step i + 1
prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
               schedule=schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1))
sgd_step = torch.optim.SGD.step


def step_and_mark(self, *args, **kwargs):
    out = sgd_step(self, *args, **kwargs)
    torch.cuda.synchronize()
    walls.append(time.time())
    prof.step()
    return out


torch.optim.SGD.step = step_and_mark
prof.start()
runpy.run_path(script, run_name="__main__")
prof.stop()
if trace_out:
    prof.export_chrome_trace(trace_out)
first_active = WAIT + WARMUP  # index of the first kept step
wall = (walls[first_active + ACTIVE - 1] - walls[first_active - 1]) / ACTIVE
device = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
span = sum(e.self_device_time_total for e in device if e.key.startswith("ProfilerStep")) / ACTIVE / 1e3
kernels = [e for e in device if not e.key.startswith("ProfilerStep")]
busy = sum(e.self_device_time_total for e in kernels) / ACTIVE / 1e3
print(f"per step: wall {wall * 1e3:.2f} ms (synchronised), GPU span {span:.2f} ms, kernels busy {busy:.2f} ms")
for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[:25]:
    print(f"  {e.self_device_time_total / ACTIVE / 1e3:7.2f} ms  x{e.count // ACTIVE:4d}  {e.key[:110]}")
