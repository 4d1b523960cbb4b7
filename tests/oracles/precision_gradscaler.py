"""Oracle for ptrain::precision::LossScaler: replays a scripted run with torch's own GradScaler and
compares the loss scale after every update with the sequence ptrain produced.

Usage: precision_gradscaler.py SEQUENCE.txt
SEQUENCE.txt (written by tests/precision/loss_scaler_test.cpp):
    line 1:  init_scale growth_factor backoff_factor growth_interval
    then one line per step:  <ok|inf|nan> <scale after update(), as a decimal>
Exit status: 0 equal, 1 different (the first differences are printed), 77 skipped.

GradScaler needs a device with AMP kernels: CUDA (torch.cuda.amp.GradScaler), or on 2.3+ the CPU
(torch.amp.GradScaler("cpu")). Debian's torch 1.13 has neither on a CPU-only machine (its
_amp_update_scale_ and _amp_foreach_non_finite_check_and_unscale_ have no CPU kernel), so there the
script exits 77 and the C++ test reports the comparison as skipped; on a GPU machine it runs.
"""
import sys

import torch

SKIP = 77


def make_scaler(device, init_scale, growth, backoff, interval):
    kwargs = dict(init_scale=init_scale, growth_factor=growth, backoff_factor=backoff, growth_interval=interval)
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler(device, **kwargs)
    return torch.cuda.amp.GradScaler(**kwargs)


def pick_device():
    if torch.cuda.is_available():
        return "cuda"
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        try:
            scaler = torch.amp.GradScaler("cpu")
            p = torch.nn.Parameter(torch.ones(1))
            scaler.scale(p.sum()).backward()
            scaler.step(torch.optim.SGD([p], lr=0.0))
            scaler.update()
            return "cpu"
        except Exception as e:  # an older release without the CPU kernels
            print(f"SKIP: GradScaler on the CPU fails here: {e}")
            return None
    print(f"SKIP: torch {torch.__version__} has no CUDA device and no CPU GradScaler")
    return None


def main(path):
    with open(path) as f:
        lines = [line.split() for line in f if line.strip()]
    init_scale, growth, backoff = (float(v) for v in lines[0][:3])
    interval = int(lines[0][3])
    device = pick_device()
    if device is None:
        return SKIP

    scaler = make_scaler(device, init_scale, growth, backoff, interval)
    param = torch.nn.Parameter(torch.ones(4, device=device))
    optimizer = torch.optim.SGD([param], lr=0.0)
    mismatches = 0
    for step, (kind, expected) in enumerate(lines[1:]):
        grad = torch.full((4,), 0.25, device=device) * scaler.get_scale()
        if kind == "inf":
            grad[1] = float("inf")
        elif kind == "nan":
            grad[2] = float("nan")
        scaler.scale(param.sum())  # GradScaler creates its scale lazily, on the first scale()
        param.grad = grad
        scaler.step(optimizer)
        scaler.update()
        got = scaler.get_scale()
        if got != float(expected):
            mismatches += 1
            if mismatches <= 10:
                print(f"step {step} ({kind}): GradScaler {got!r}, ptrain {expected}")
    print(f"{device}: {len(lines) - 1} steps, {mismatches} mismatches")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
