#!/usr/bin/env python3
"""Exports a torchvision model (or any module a Python expression builds) as the TorchScript archive that
`ptrain train --model FILE.pt` and `bench/pytorch_reference.py --model FILE.pt` train.

  python3 scripts/export_torchscript.py --model convnext_tiny --num-classes 10 --out .data/convnext_tiny.pt
  python3 scripts/export_torchscript.py --model regnet_y_800mf --num-classes 10 --trace --image-size 224 \\
      --out .data/regnet.pt
  python3 scripts/export_torchscript.py --expr "torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10))" \\
      --out .data/linear.pt

Scripting (the default) keeps both branches of `if self.training`; tracing records one run, in the mode
the module is in (--trace traces in training mode, so dropout and batch statistics behave as in
training; evaluation then runs that same graph).
"""
import argparse
import sys

import torch
import torchvision


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a torchvision.models builder, e.g. convnext_tiny, vit_b_16, regnet_y_800mf")
    p.add_argument("--expr", help="a Python expression building the module instead (torch and torchvision imported)")
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trace", action="store_true", help="torch.jit.trace instead of torch.jit.script")
    p.add_argument("--image-size", type=int, default=224, help="--trace: the example input's size")
    p.add_argument("--in-channels", type=int, default=3, help="--trace: the example input's channels")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    if (a.model is None) == (a.expr is None):
        p.error("give --model or --expr")
    torch.manual_seed(a.seed)
    if a.model:
        builder = getattr(torchvision.models, a.model, None)
        if builder is None:
            p.error(f"--model: torchvision.models has no '{a.model}'")
        module = builder(num_classes=a.num_classes)
    else:
        module = eval(a.expr, {"torch": torch, "torchvision": torchvision})
    module.train()
    if a.trace:
        example = torch.zeros(2, a.in_channels, a.image_size, a.image_size)
        exported = torch.jit.trace(module, example)
    else:
        exported = torch.jit.script(module)
    exported.save(a.out)
    params = sum(t.numel() for t in module.parameters())
    print(f"{a.out}: {'traced' if a.trace else 'scripted'} {a.model or a.expr}, {params} parameters")


if __name__ == "__main__":
    sys.exit(main())
