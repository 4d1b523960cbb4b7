"""Oracle for ptrain::precision::AutocastGuard: runs a small conv/batch_norm/relu/linear/softmax sequence
under torch.autocast("cpu", dtype=torch.bfloat16) and writes each op's output dtype and values as JSON.

Usage: precision_autocast.py OUT.json
The inputs are closed-form (sin/cos of arange) so that the C++ test builds the same tensors without
exchanging files. Dtype names are c10's (Float, BFloat16, Half) for a direct comparison.
"""
import json
import sys

import torch
import torch.nn.functional as F

C10_NAMES = {torch.float32: "Float", torch.bfloat16: "BFloat16", torch.float16: "Half", torch.float64: "Double"}


def wave(n, step, fn, amplitude):
    return fn(torch.arange(n, dtype=torch.float32) * step) * amplitude


def main(out_path):
    x = wave(2 * 3 * 8 * 8, 0.1, torch.sin, 1.0).reshape(2, 3, 8, 8)
    conv_w = wave(4 * 3 * 3 * 3, 0.37, torch.cos, 0.2).reshape(4, 3, 3, 3)
    conv_b = torch.arange(4, dtype=torch.float32) * 0.01
    bn_w = torch.full((4,), 1.5)
    bn_b = torch.arange(4, dtype=torch.float32) * 0.1
    lin_w = wave(10 * 256, 0.05, torch.sin, 0.1).reshape(10, 256)
    lin_b = torch.zeros(10)

    results = {}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = F.conv2d(x, conv_w, conv_b, padding=1)
        results["conv2d"] = y
        y = F.batch_norm(y, torch.zeros(4), torch.ones(4), bn_w, bn_b, training=True, momentum=0.1, eps=1e-5)
        results["batch_norm"] = y
        y = F.relu(y)
        results["relu"] = y
        y = F.linear(y.flatten(1), lin_w, lin_b)
        results["linear"] = y
        y = F.softmax(y, dim=1)
        results["softmax"] = y
        results["log_softmax"] = F.log_softmax(results["linear"], dim=1)
    out = {name: {"dtype": C10_NAMES[t.dtype], "values": t.float().flatten().tolist()} for name, t in results.items()}
    with open(out_path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(sys.argv[1])
