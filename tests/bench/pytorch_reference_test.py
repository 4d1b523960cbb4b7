#!/usr/bin/env python3
"""Tests bench/pytorch_reference.py on the CPU: single, dp, and ddp and zero1 over gloo under torchrun; and its
GPT path against ptrain itself (the binary given as the first argument).

Each run's JSON is checked against docs/metrics.md (every documented field present, typed as its unit says,
null only where the table allows it) and against the strategy's arithmetic (world_size, devices,
global_batch_size, steps per epoch when each rank trains on half of it). Then the strategies are checked to
train the same model: with augmentation off and GroupNorm instead of BatchNorm (no batch statistics),
2 ranks with batch B must end where one process with batch 2B ends, and both ranks must hold the same
parameters. A control run (dp on the CPU, batch B on one process) shows that the comparison can tell a wrong gradient
apart.

The GPT path trains ptrain's gpt-tiny shape on ptrain's synthetic tokens with AdamW, in ptrain and in the
reference, from the same seed (the reference draws ptrain's initialisation) and then from the same weights
file (.pth, and .safetensors for the reference): every epoch's training and test loss and accuracy must agree
to float32 rounding, and a control run with another beta2 must not. Plain Python; exits non-zero on failure.
"""
import contextlib
import io
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
        m = re.match(r"\|\s*`([a-z0-9_]+)`\s*\|([^|]*)\|[^|]*\|[^|]*\|([^|]*)\|", line)
        if m:
            rows.append((m.group(1), m.group(2).strip(), not m.group(3).strip().startswith("never")))
    assert rows, f"no field table under '## {section}' in docs/metrics.md"
    return rows


UNIT_TYPES = {
    "integer": int, "processes": int, "devices": int, "images": int, "epochs": int, "steps": int,
    "pixels": int, "bytes": int, "index": int, "text": str, "seconds": float, "images/second": float,
    "percent": float, "fraction": float, "loss": float, "list": list, "object": dict, "tokens": int,
    "tokens/second": float, "true/false": bool, "FLOPs": float, "TFLOP/s": float,
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
        # On the CPU every steady step is timed by itself (one entry a step), and the statistics are those entries'.
        times = r.get("steady_step_seconds") or []
        if want_from is not None and check(r.get("steady_step_timing") == "step",
                                           f"{name}: steady_step_timing {r.get('steady_step_timing')!r} on the CPU"):
            check(len(times) == steps - want_from, f"{name}: {len(times)} steady step times for steps "
                  f"{want_from + 1}-{steps}")
            ordered = sorted(times)
            mid = (ordered[(len(ordered) - 1) // 2] + ordered[len(ordered) // 2]) / 2 if ordered else None
            check(mid is not None and abs(r.get("steady_step_median_seconds") - mid) < 1e-12,
                  f"{name}: steady_step_median_seconds {r.get('steady_step_median_seconds')!r}, median {mid!r}")
            check(ordered and ordered[0] <= r["steady_step_p10_seconds"] <= r["steady_step_median_seconds"]
                  <= r["steady_step_p90_seconds"] <= ordered[-1], f"{name}: p10/median/p90 out of order or range")
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


GPT_SHAPE = ["--model", "gpt-tiny", "--gpt-layers", "2", "--gpt-width", "32", "--gpt-heads", "4", "--batch-size", "8",
             "--epochs", "2", "--optimizer", "adamw", "--lr", "3e-3", "--warmup-steps", "2", "--weight-decay", "0.01",
             "--beta2", "0.98", "--test-limit", "16", "--seed", "5", "--device", "cpu"]
GPT_DATA = "96:16:40"  # 96 training sequences of 16 tokens (12 steps an epoch), 19 test sequences, vocabulary 40
GPT_TOLERANCE = 1e-5  # relative: float32 rounding of two implementations over 24 AdamW steps (seen: 6e-8)


def run_ptrain(ptrain, args, tmp, name):
    cmd = [ptrain, "train", "--dataset", "synthetic-tokens", "--data-path", GPT_DATA, "--threads", "1",
           "--progress", "none"] + args
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=120)
    print(f"-- {name}: rc {proc.returncode}, {time.time() - t0:.1f}s", flush=True)
    if not check(proc.returncode == 0, f"{name}: exit status {proc.returncode}"):
        print(" ".join(cmd))
        print(proc.stdout[-3000:] + proc.stderr[-3000:])


def gpt_curve(path):
    """(train loss, train accuracy, test loss, test accuracy) of every epoch, from a record."""
    r = strict_json(path)
    return [(e["train_loss"], e["train_accuracy"], e["test_loss"], e["test_accuracy"]) for e in r["epochs_detail"]]


def curve_difference(a_path, b_path):
    a, b = gpt_curve(a_path), gpt_curve(b_path)
    if len(a) != len(b) or not a:
        return math.inf
    worst = 0.0
    for ea, eb in zip(a, b):
        for va, vb in zip(ea, eb):
            if va is None or vb is None:
                return math.inf
            worst = max(worst, abs(va - vb) / max(abs(vb), 1e-12))
    return worst


def write_gpt_weights(tmp):
    """Random weights (biases and LayerNorms too, so that every parameter matters) under ptrain's names, as a
    torch.save file and as safetensors."""
    sys.path.insert(0, os.path.dirname(SCRIPT))
    import pytorch_reference
    torch.manual_seed(11)
    model = pytorch_reference.Gpt(40, 16, 2, 32, 4)
    state = {}
    for k, v in model.state_dict().items():
        state[k] = torch.randn(v.shape) * (0.1 if v.dim() == 1 else 0.05) + (1.0 if ".ln_" in k or "ln_f" in k else 0.0)
    torch.save(state, os.path.join(tmp, "gpt.pth"))
    header, blobs, offset = {}, [], 0
    for k, v in state.items():
        data = v.contiguous().numpy().tobytes()
        header[k] = {"dtype": "F32", "shape": list(v.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    with open(os.path.join(tmp, "gpt.safetensors"), "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + b"".join(blobs))


def check_gpt_record(name, path, framework):
    if not check(os.path.exists(path), f"{name}: {path} not written"):
        return
    r = strict_json(path)
    if framework == "pytorch":
        check_typed(name, r, documented_fields("Run record fields"))
    expected = {"model": "gpt-tiny", "dataset": "synthetic-tokens", "seq_len": 16, "image_size": 0, "steps": 24,
                "channels_last": False, "fused_optimizer": False,
                "compiled": False if framework == "pytorch" else None}
    for key, want in expected.items():
        check(r.get(key) == want, f"{name}: {key} = {r.get(key)!r}, expected {want!r}")
    for tokens, sequences in (("tokens_per_second", "images_per_second"),
                              ("steady_tokens_per_second", "steady_images_per_second")):
        check(isinstance(r.get(tokens), float) and abs(r[tokens] - 16 * r[sequences]) < 1e-6 * r[tokens],
              f"{name}: {tokens} {r.get(tokens)!r} is not seq_len x {sequences} {r.get(sequences)!r}")


def gpt_against_ptrain(ptrain, tmp):
    p = lambda name: os.path.join(tmp, name)  # noqa: E731
    env = dict(os.environ, OMP_NUM_THREADS="1")

    def reference(args, name):
        cmd = [PYTHON, SCRIPT, "--dataset", "synthetic-tokens", "--data", GPT_DATA] + args
        t0 = time.time()
        proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=120)
        print(f"-- {name}: rc {proc.returncode}, {time.time() - t0:.1f}s", flush=True)
        if not check(proc.returncode == 0, f"{name}: exit status {proc.returncode}"):
            print(" ".join(cmd))
            print(proc.stdout[-3000:] + proc.stderr[-3000:])

    write_gpt_weights(tmp)
    run_ptrain(ptrain, GPT_SHAPE + ["--metrics-out", p("gpt-ptrain.json")], tmp, "ptrain gpt from its seed")
    run_ptrain(ptrain, GPT_SHAPE + ["--weights", p("gpt.pth"), "--metrics-out", p("gpt-ptrain-w.json")], tmp,
               "ptrain gpt from gpt.pth")
    reference(GPT_SHAPE + ["--metrics-out", p("gpt-ref.json")], "reference gpt from ptrain's seed")
    reference(GPT_SHAPE + ["--weights", p("gpt.pth"), "--metrics-out", p("gpt-ref-w.json")], "reference gpt.pth")
    reference(GPT_SHAPE + ["--weights", p("gpt.safetensors"), "--metrics-out", p("gpt-ref-st.json")],
              "reference gpt.safetensors")
    control = [v if v != "0.98" else "0.999" for v in GPT_SHAPE]
    reference(control + ["--weights", p("gpt.pth"), "--metrics-out", p("gpt-ref-control.json")],
              "reference gpt.pth, beta2 0.999 (control)")
    if not all(os.path.exists(p(f)) for f in ("gpt-ptrain.json", "gpt-ptrain-w.json", "gpt-ref.json", "gpt-ref-w.json",
                                              "gpt-ref-st.json", "gpt-ref-control.json")):
        check(False, "gpt: a run wrote no record")
        return
    check_gpt_record("gpt ptrain", p("gpt-ptrain.json"), "ptrain")
    check_gpt_record("gpt reference", p("gpt-ref.json"), "pytorch")
    # Two counts of one job's model FLOPs: ptrain's from its GPT's shape, the reference's from its modules' weights.
    ours, theirs = (strict_json(p(n)).get("model_flops_per_step") for n in ("gpt-ptrain.json", "gpt-ref.json"))
    check(ours is not None and ours == theirs, f"gpt: ptrain counts {ours} model FLOPs a step, the reference {theirs}")
    seeded = curve_difference(p("gpt-ref.json"), p("gpt-ptrain.json"))
    weighted = curve_difference(p("gpt-ref-w.json"), p("gpt-ptrain-w.json"))
    control = curve_difference(p("gpt-ref-control.json"), p("gpt-ptrain-w.json"))
    print(f"   gpt reference vs ptrain: from the seed {seeded:.3g}, from gpt.pth {weighted:.3g} (relative, worst "
          f"epoch value); control with beta2 0.999 {control:.3g}")
    print(f"   ptrain    {gpt_curve(p('gpt-ptrain.json'))}")
    print(f"   reference {gpt_curve(p('gpt-ref.json'))}")
    check(seeded < GPT_TOLERANCE, f"gpt: from the same seed the reference ends {seeded} from ptrain (tolerance "
                                  f"{GPT_TOLERANCE}): another initialisation, data or step")
    check(weighted < GPT_TOLERANCE, f"gpt: from the same weights the reference ends {weighted} from ptrain")
    check(gpt_curve(p("gpt-ref-st.json")) == gpt_curve(p("gpt-ref-w.json")),
          "gpt: the same weights from .safetensors and .pth train differently")
    check(control > 10 * GPT_TOLERANCE, f"gpt control: beta2 0.999 against 0.98 ends only {control} away; the "
                                        f"tolerance cannot tell")


def max_difference(a_path, b_path):
    a, b = torch.load(a_path), torch.load(b_path)
    if set(a) != set(b):
        return math.inf
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def refused_in_this_process(args, tmp):
    """(exit status, stderr) of the script's main(args) called here, as its own process in tmp without
    RANK/WORLD_SIZE/LOCAL_RANK would give them."""
    sys.path.insert(0, os.path.dirname(SCRIPT))
    import pytorch_reference
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        os.environ.pop(key, None)
    os.chdir(tmp)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            pytorch_reference.main(args)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except Exception as e:  # noqa: BLE001 -- an uncaught exception: the process would have exited 1
        err.write(repr(e))
        code = 1
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return code, err.getvalue()


def main():
    t0 = time.time()
    ptrain = sys.argv[1] if len(sys.argv) > 1 else None
    with tempfile.TemporaryDirectory(prefix="pytorch_reference_test.") as tmp:
        if check(ptrain and os.access(ptrain, os.X_OK), f"the ptrain executable (first argument) {ptrain!r}"):
            gpt_against_ptrain(ptrain, tmp)

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

        # The refusals happen before any training. One runs as its own process (the script's exit status and
        # stderr); the others call the script's main() in this process, which has imported torch and the script
        # already: a process each would spend about two CPU-seconds importing torch to print one line.
        gpt = ["--dataset", "synthetic-tokens", "--data", GPT_DATA] + GPT_SHAPE
        refusals = {
            "fsdp on the CPU": (COMMON + ["--strategy", "fsdp"], "--strategy fsdp"),
            "ddp without torchrun": (COMMON + ["--strategy", "ddp"], "torchrun"),
            "channels-last GPT": (gpt + ["--channels-last"], "--channels-last: gpt-tiny has no convolutions"),
            "GPT on images": (COMMON + ["--model", "gpt-tiny"], "needs a token dataset"),
            "fp8 on the CPU": (gpt + ["--precision", "fp8"], "--precision fp8 needs a CUDA device"),
            "a compile mode without --compile": (COMMON + ["--compile-mode", "reduce-overhead"],
                                                 "--compile-mode reduce-overhead needs --compile"),
        }
        if not hasattr(torch, "compile"):  # Debian's 1.13: neither torch.compile nor fused optimizers
            refusals["compile"] = (COMMON + ["--compile"], "--compile needs torch.compile (PyTorch 2.x)")
            refusals["fused"] = (gpt + ["--fused-optimizer"], "--fused-optimizer: torch")
        for name, (args, want) in refusals.items():
            if name == "ddp without torchrun":
                env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
                proc = subprocess.run([PYTHON, SCRIPT] + args, cwd=tmp, env=env, text=True, capture_output=True,
                                      timeout=120)
                code, err = proc.returncode, proc.stderr
            else:
                code, err = refused_in_this_process(args, tmp)
            check(code == 2 and want in err,
                  f"{name}: rc {code}, expected 2 and a message naming {want}: {err[-300:]!r}")

    print(f"{'FAILED' if failures else 'PASSED'}: pytorch_reference, {len(failures)} failure(s), "
          f"{time.time() - t0:.1f}s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
