#!/usr/bin/env python3
"""Runs the PyTorch reference (or another version of it) with CUDA's sync debug mode on and counts, by source
line, the operations that made the host wait for the GPU: a step loop that should queue work ahead of the GPU
must have none.

  python3 scripts/reference_sync_check.py bench/pytorch_reference.py --data .data/cifar10 --precision amp-bf16 \\
      --channels-last --max-steps 12 --epochs 1 --train-limit 1536 --test-limit 128
"""
import collections
import runpy
import sys
import warnings

import torch

script = sys.argv[1]
sys.argv = [script] + sys.argv[2:]
sys.path.insert(0, "bench")
torch.cuda.set_sync_debug_mode("warn")
counts = collections.Counter()


def count(message, category, filename, lineno, file=None, line=None):
    counts[f"{filename.split('/')[-1]}:{lineno}"] += 1


warnings.showwarning = count
warnings.simplefilter("always")
runpy.run_path(script, run_name="__main__")
print("synchronizing operations by line:", dict(counts.most_common()), flush=True)
