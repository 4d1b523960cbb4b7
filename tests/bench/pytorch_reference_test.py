#!/usr/bin/env python3
"""Tests bench/pytorch_reference.py on the CPU: single, dp, and ddp and zero1 over gloo under torchrun.

Each run's JSON is checked against docs/metrics.md (every documented field present, typed as its unit says,
null only where the table allows it) and against the strategy's arithmetic (world_size, devices,
global_batch_size, steps per epoch when each rank trains on half of it). Then the strategies are checked to
train the same model: with augmentation off and GroupNorm instead of BatchNorm (no batch statistics),
2 ranks with batch B must end where one process with batch 2B ends, and both ranks must hold the same
parameters. A control run (dp on the CPU, batch B on one process) shows that the comparison can tell a wrong gradient
apart. Plain Python; exits non-zero on failure.
"""
import json
import math
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "pytorch_reference.py")
PYTHON = sys.executable
TRAIN_IMAGES = 64  # 64:3x16x16:4 -> 64 training images, 12 test images
COMMON = ["--dataset", "synthetic", "--data", f"{TRAIN_IMAGES}:3x16x16:4", "--model", "resnet18",
          "--image-size", "16", "--device", "cpu", "--epochs", "1", "--lr", "0.01", "--warmup-epochs", "0", "--seed", "3"]
EXACT = ["--norm", "group", "--no-augment"]  # no batch statistics, no per-rank randomness
SAME_MODEL_TOLERANCE = 1e-5  # float32 reduction order differs between 2 ranks x B and 1 x 2B

failures = []


def check(condition, what):
    if not condition:
        failures.append(what)
        print(f"FAIL: {what}", flush=True)
    return condition


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(args, tmp, name, torchrun=False, expect_rc=0):
    cmd = [PYTHON, SCRIPT] + args
    if torchrun:
        # --redirects/--tee 1: torch 1.13's launcher on Python 3.11 cannot parse its own default "0"
        # (IntFlag iteration no longer yields Std.NONE); rank output is teed to the console with a prefix.
        cmd = [PYTHON, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
               "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "--redirects", "1", "--tee", "1",
               "--log_dir", os.path.join(tmp, "logs-" + name), SCRIPT] + args
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=240)
    print(f"-- {name}: rc {proc.returncode}, {time.time() - t0:.1f}s", flush=True)
    if not check(proc.returncode == expect_rc, f"{name}: exit status {proc.returncode}, expected {expect_rc}"):
        print(" ".join(cmd))
        print(proc.stdout[-4000:])
        print(proc.stderr[-4000:])
    return proc


def documented_fields(section):
    """(field, unit, nullable) rows of the docs/metrics.md table under the heading `section`."""
    with open(os.path.join(ROOT, "docs", "metrics.md")) as f:
        text = f.read()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in body.splitlines():
        m = re.match(r"\|\s*`([a-z_]+)`\s*\|([^|]*)\|[^|]*\|[^|]*\|([^|]*)\|", line)
        if m:
            rows.append((m.group(1), m.group(2).strip(), not m.group(3).strip().startswith("never")))
    assert rows, f"no field table under '## {section}' in docs/metrics.md"
    return rows


UNIT_TYPES = {
    "integer": int, "processes": int, "devices": int, "images": int, "epochs": int, "steps": int,
    "pixels": int, "bytes": int, "index": int, "text": str, "seconds": float, "images/second": float,
    "percent": float, "fraction": float, "loss": float, "list": list, "object": dict,
}


def check_typed(where, obj, rows):
    for field, unit, nullable in rows:
        if not check(field in obj, f"{where}: documented field '{field}' missing"):
            continue
        value = obj[field]
        if value is None:
            check(nullable, f"{where}: '{field}' is null, docs/metrics.md says never")
            continue
        kind = UNIT_TYPES.get(unit.split()[0])
        if not check(kind is not None, f"{where}: docs/metrics.md unit '{unit}' of '{field}' unknown to this test"):
            continue
        if kind is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        elif kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, kind)
        check(ok, f"{where}: '{field}' = {value!r} is not {kind.__name__} ({unit})")


def strict_json(path):
    def reject(constant):
        raise ValueError(f"{path}: non-JSON constant {constant}")
    with open(path) as f:
        return json.load(f, parse_constant=reject)


def check_record(name, path, strategy, world_size, devices, batch, steps, evaluated=True):
    if not check(os.path.exists(path), f"{name}: {path} not written"):
        return None
    r = strict_json(path)
    check_typed(name, r, documented_fields("Run record fields"))
    for i, e in enumerate(r.get("epochs_detail") or []):
        check_typed(f"{name}: epochs_detail[{i}]", e, documented_fields("Epoch fields"))
    expected = {"strategy": strategy, "world_size": world_size, "devices": devices, "batch_size_per_device": batch,
                "global_batch_size": batch * devices, "steps": steps, "epochs": 1, "image_size": 16,
                "device": "cpu", "dataset": "synthetic", "model": "resnet18", "precision": "fp32",
                "framework": "pytorch"}
    for key, want in expected.items():
        check(r.get(key) == want, f"{name}: {key} = {r.get(key)!r}, expected {want!r}")
    # PyTorch in Python counts no CPU allocations, and the CPU has no NVML: docs/metrics.md says null, never 0.
    for key in ("peak_allocated_bytes", "peak_reserved_bytes", "peak_nvml_used_bytes", "gpu_util_mean",
                "gpu_util_peak"):
        check(r.get(key) is None, f"{name}: {key} = {r.get(key)!r} on the CPU, expected null")
    epochs = r.get("epochs_detail") or []
    if check(len(epochs) == 1, f"{name}: {len(epochs)} epoch records, expected 1"):
        e = epochs[0]
        images = steps * batch * devices
        check(e["images"] == images, f"{name}: epoch images {e['images']}, expected {images} over all ranks")
        check(isinstance(e["train_loss"], float) and 0 < e["train_loss"] < 100,
              f"{name}: train_loss {e['train_loss']!r} not a finite, plausible loss")
        ips = r.get("images_per_second")
        check(isinstance(ips, float) and abs(ips * r["train_wall_seconds"] - images) < 1e-6 * images,
              f"{name}: images_per_second {ips!r} is not all ranks' {images} images / train_wall_seconds")
        # The steady clock starts after ptrain's number of warm-up steps: 10, or a quarter of a shorter run.
        want_from = min(10, steps // 4) if steps >= 8 else None
        steady = r.get("steady_images_per_second")
        check(r.get("steady_from_step") == want_from, f"{name}: steady_from_step {r.get('steady_from_step')!r}, "
              f"expected {want_from!r} for {steps} steps")
        check((steady is None) == (want_from is None), f"{name}: steady_images_per_second {steady!r} for {steps} steps")
    if evaluated:
        acc, loss = r.get("final_test_accuracy"), r.get("final_test_loss")
        check(isinstance(acc, (int, float)) and 0 <= acc <= 1, f"{name}: final_test_accuracy {acc!r}")
        check(isinstance(loss, float) and math.isfinite(loss), f"{name}: final_test_loss {loss!r}")
        # 12 test images: accuracy is a multiple of 1/12 only if every image was counted exactly once.
        check(isinstance(acc, (int, float)) and abs(acc * 12 - round(acc * 12)) < 1e-9,
              f"{name}: final_test_accuracy {acc!r} is not k/12: test images lost or counted twice")
    else:
        check(r.get("final_test_accuracy") is None and epochs and epochs[0]["test_accuracy"] is None,
              f"{name}: --no-eval yet test accuracy written")
    return r


def max_difference(a_path, b_path):
    a, b = torch.load(a_path), torch.load(b_path)
    if set(a) != set(b):
        return math.inf
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def main():
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="pytorch_reference_test.") as tmp:
        p = lambda name: os.path.join(tmp, name)  # noqa: E731
        half_epoch_steps = TRAIN_IMAGES // 2 // 4  # each of 2 ranks: 32 images, batch 4

        run(COMMON + EXACT + ["--batch-size", "8", "--metrics-out", p("single.json"), "--dump-params",
                              p("single.pt")], tmp, "single batch 8")
        check_record("single", p("single.json"), "single", 1, 1, 8, TRAIN_IMAGES // 8)

        # dp on the CPU is the module itself. Its run is also the control for the comparisons below: batch 4
        # on one process follows half the gradient, and the comparison must tell it from 2 ranks x batch 4.
        run(COMMON + EXACT + ["--strategy", "dp", "--batch-size", "4", "--max-steps", str(half_epoch_steps),
                              "--no-eval", "--metrics-out", p("dp.json"), "--dump-params", p("dp.pt")],
            tmp, "dp batch 4 (control)")
        check_record("dp", p("dp.json"), "dp", 1, 1, 4, half_epoch_steps, evaluated=False)

        for strategy in ("ddp", "zero1"):
            run(COMMON + EXACT + ["--strategy", strategy, "--batch-size", "4", "--metrics-out", p(f"{strategy}.json"),
                                  "--dump-params", p(f"{strategy}.pt")], tmp, f"{strategy} 2 ranks x batch 4",
                torchrun=True)
            check_record(strategy, p(f"{strategy}.json"), strategy, 2, 2, 4, half_epoch_steps)
            check(not os.path.exists(p(f"{strategy}.json.rank1")), f"{strategy}: rank 1 wrote a JSON too")
            if check(os.path.exists(p(f"{strategy}.pt")) and os.path.exists(p(f"{strategy}.pt.rank1")),
                     f"{strategy}: --dump-params files of both ranks"):
                ranks = max_difference(p(f"{strategy}.pt"), p(f"{strategy}.pt.rank1"))
                check(ranks == 0, f"{strategy}: ranks 0 and 1 end with parameters {ranks} apart, expected equal")
                same = max_difference(p(f"{strategy}.pt"), p("single.pt"))
                print(f"   {strategy} 2x4 vs single 1x8: max parameter difference {same:.3g}")
                check(same < SAME_MODEL_TOLERANCE, f"{strategy}: 2 ranks x batch 4 end {same} from single "
                                                    f"batch 8 (tolerance {SAME_MODEL_TOLERANCE})")

        if os.path.exists(p("dp.pt")) and os.path.exists(p("ddp.pt")):
            control = max_difference(p("dp.pt"), p("ddp.pt"))
            print(f"   control dp 1x4 vs ddp 2x4: max parameter difference {control:.3g}")
            check(control > 100 * SAME_MODEL_TOLERANCE,
                  f"control: a wrong gradient ends only {control} away; the tolerance cannot tell")

        # Both refusals happen before any training; started together, their imports overlap.
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        refusals = {
            "fsdp on the CPU": (["--strategy", "fsdp"], "--strategy fsdp"),
            "ddp without torchrun": (["--strategy", "ddp"], "torchrun"),
        }
        procs = {name: subprocess.Popen([PYTHON, SCRIPT] + COMMON + args, cwd=tmp, env=env, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for name, (args, _) in refusals.items()}
        for name, proc in procs.items():
            _, err = proc.communicate(timeout=120)
            want = refusals[name][1]
            check(proc.returncode == 2 and want in err,
                  f"{name}: rc {proc.returncode}, expected 2 and a message naming {want}: {err[-300:]!r}")

    print(f"{'FAILED' if failures else 'PASSED'}: pytorch_reference, {len(failures)} failure(s), "
          f"{time.time() - t0:.1f}s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
