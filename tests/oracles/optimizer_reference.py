#!/usr/bin/env python3
"""Oracle for ptrain's optimizers: runs torch.optim.SGD / AdamW on seeded parameters and gradients and
saves the inputs and the parameters after each step, so the C++ test can replay the same gradients."""
import argparse

import torch

p = argparse.ArgumentParser()
p.add_argument("--optimizer", choices=["sgd", "sgd-nesterov", "adamw"], required=True)
p.add_argument("--steps", type=int, default=5)
p.add_argument("--out", required=True)
a = p.parse_args()

g = torch.Generator().manual_seed(1234)
shapes = [(8, 3, 3, 3), (8,), (10, 8)]
params = [torch.randn(s, generator=g, dtype=torch.float32).requires_grad_() for s in shapes]
saved = {}
for i, t in enumerate(params):
    saved[f"init.{i}"] = t.detach().clone()
if a.optimizer == "adamw":
    opt = torch.optim.AdamW(params, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
else:
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=a.optimizer == "sgd-nesterov", weight_decay=5e-4)
for s in range(a.steps):
    for i, t in enumerate(params):
        grad = torch.randn(t.shape, generator=g)
        saved[f"grad.{s}.{i}"] = grad.clone()
        t.grad = grad
    opt.step()
    for i, t in enumerate(params):
        saved[f"after.{s}.{i}"] = t.detach().clone()
torch.save(saved, a.out)
