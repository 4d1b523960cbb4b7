#!/usr/bin/env python3
"""Checks on a GPU machine (PyTorch 2.x) what the CPU tests cannot: the PyTorch reference compiled and with
fused optimizers, and `ptrain bench` running a suite of two workloads with both PyTorch variants.

  pytorch_reference_gpu_check.py PTRAIN OUT_DIR [CIFAR10_DIR]

1. `ptrain bench` on a small two-workload suite (ResNet-18 at 64 px on CIFAR-10, or on synthetic images
   without it; a 4-layer GPT of width 256 on synthetic tokens), AMP bf16, ptrain beside PyTorch eager and
   compiled: every record written, each saying what ran (compiled, fused_optimizer, channels_last), the
   compiled ones with graphs built, and the report's side-by-side rows with both ratios.
2. The reference alone where the bench does not go: AMP fp16 with GradScaler and the fused SGD step (NCHW),
   pure bf16 compiled with the fused AdamW.
3. The same GPT trained by ptrain and by the reference from the same seed, fp32 with TF32 off: the losses
   agree, so the reference draws ptrain's initialisation and data on LibTorch/PyTorch 2.x as well.
4. That GPT in fp8 (Hopper/Ada): ptrain's and the compiled reference's records name 16 projections in FP8
   and the head in bf16, and both end within 3% of ptrain's amp-bf16 loss.
About two to three minutes on an H200, most of it torch.compile. Exits non-zero on failure.
"""
import json
import math
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "pytorch_reference.py")
GPT = ["--model", "gpt-tiny", "--gpt-layers", "4", "--gpt-width", "256", "--gpt-heads", "4", "--batch-size", "16",
       "--optimizer", "adamw", "--lr", "1e-3", "--warmup-steps", "2", "--max-steps", "16", "--test-limit", "32"]
GPT_DATA = "256:256:8192"
failures = []


def check(condition, what):
    print(("ok   " if condition else "FAIL ") + what, flush=True)
    if not condition:
        failures.append(what)
    return condition


def run(cmd, name, env=None):
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    print(f"-- {name}: rc {proc.returncode}, {time.time() - t0:.1f}s", flush=True)
    if proc.returncode != 0:
        print(" ".join(cmd))
        print((proc.stdout + proc.stderr)[-4000:])
    return proc


def record(path):
    with open(path) as f:
        return json.load(f)


def bench(ptrain, out, cifar):
    data = (f"dataset: cifar10, data-path: {cifar}, train-limit: 2048, loader-threads: 8" if cifar else
            'dataset: synthetic, data-path: "2048:3x32x32:10"')
    suite = os.path.join(out, "suite.yaml")
    with open(suite, "w") as f:
        f.write(f"""name: speed-check
workloads:
  resnet: {{model: resnet18, {data}, image-size: 64, test-limit: 256, channels-last: true, batch-size: 64,
           epochs: 1, max-steps: 16, lr: 0.05, warmup-epochs: 0}}
  gpt: {{model: gpt-tiny, gpt-layers: 4, gpt-width: 256, gpt-heads: 4, dataset: synthetic-tokens, data-path: "{GPT_DATA}",
        batch-size: 16, epochs: 1, max-steps: 16, test-limit: 32, optimizer: adamw, lr: 1e-3, warmup-steps: 2}}
runs:
  - {{workload: resnet, precision: amp-bf16, pytorch: [eager, compiled]}}
  - {{workload: gpt, precision: amp-bf16, pytorch: [eager, compiled]}}
""")
    proc = run([ptrain, "bench", "--suite", suite, "--pytorch", "--python", sys.executable, "--no-estimate",
                "--run-timeout", "240", "--source-dir", ROOT, "--out", os.path.join(out, "bench")], "ptrain bench")
    check(proc.returncode == 0, "ptrain bench of two workloads, eager and compiled: exit status 0")
    runs = os.path.join(out, "bench", "runs")
    for workload in ("resnet", "gpt"):
        for framework, compiled in (("ptrain", None), ("pytorch", False), ("pytorch-compiled", True)):
            path = os.path.join(runs, framework, workload, "amp-bf16-single-x1.json")
            if not check(os.path.exists(path), f"{framework}/{workload}: record written"):
                continue
            r = record(path)
            check(r.get("compiled") == compiled, f"{framework}/{workload}: compiled {r.get('compiled')}")
            if framework != "ptrain":  # ptrain's own fused step is ptrain's business
                check(r.get("fused_optimizer") == bool(compiled), f"{framework}/{workload}: fused_optimizer "
                                                                   f"{r.get('fused_optimizer')}")
            check(r.get("channels_last") == (workload == "resnet"), f"{framework}/{workload}: channels_last "
                                                                   f"{r.get('channels_last')}")
            check(isinstance(r.get("steady_images_per_second"), float), f"{framework}/{workload}: steady throughput "
                                                                         f"{r.get('steady_images_per_second')}")
            if workload == "gpt":
                check(isinstance(r.get("steady_tokens_per_second"), float) and r.get("seq_len") == 256,
                      f"{framework}/{workload}: {r.get('steady_tokens_per_second')} tokens/s, seq_len {r.get('seq_len')}")
            if compiled:
                graphs = (r.get("extra", {}).get("compile") or {}).get("graphs")
                check(isinstance(graphs, int) and graphs > 0, f"{framework}/{workload}: {graphs} graph(s) compiled")
            loss = (r.get("epochs_detail") or [{}])[-1].get("train_loss")
            check(isinstance(loss, float) and math.isfinite(loss), f"{framework}/{workload}: train loss {loss}")
    report = os.path.join(out, "bench", "report.md")
    if check(os.path.exists(report), "report.md written"):
        text = open(report).read()
        rows = [line for line in text.splitlines() if line.startswith("| resnet18 |") or line.startswith("| gpt-tiny |")]
        print("\n".join(rows))
        check(len(rows) == 2 and all(line.count("x |") >= 2 for line in rows),
              "side-by-side rows for both models with both ratios")


def reference_alone(out):
    cases = {
        "resnet amp-fp16, GradScaler + fused SGD, NCHW":
            (["--dataset", "synthetic", "--data", "1024:3x32x32:10", "--model", "resnet18", "--image-size", "64",
              "--batch-size", "64", "--max-steps", "12", "--precision", "amp-fp16", "--fused-optimizer"],
             dict(compiled=False, fused_optimizer=True, channels_last=False)),
        "gpt pure bf16, compiled + fused AdamW":
            (["--dataset", "synthetic-tokens", "--data", GPT_DATA] + GPT + ["--precision", "bf16", "--compile",
                                                                             "--fused-optimizer"],
             dict(compiled=True, fused_optimizer=True, channels_last=False)),
    }
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(out, "inductor"))
    for name, (args, want) in cases.items():
        path = os.path.join(out, name.split(",")[0].replace(" ", "-") + ".json")
        proc = run([sys.executable, SCRIPT] + args + ["--metrics-out", path], name, env)
        if check(proc.returncode == 0 and os.path.exists(path), f"{name}: ran"):
            r = record(path)
            for key, value in want.items():
                check(r.get(key) == value, f"{name}: {key} {r.get(key)}")
            loss = r["epochs_detail"][-1]["train_loss"]
            check(isinstance(loss, float) and math.isfinite(loss), f"{name}: train loss {loss}")


def same_gpt_as_ptrain(ptrain, out):
    common = GPT + ["--precision", "fp32", "--seed", "3"]
    p_path, r_path = os.path.join(out, "gpt-ptrain-fp32.json"), os.path.join(out, "gpt-reference-fp32.json")
    run([ptrain, "train", "--dataset", "synthetic-tokens", "--data-path", GPT_DATA, "--progress", "none",
         "--metrics-out", p_path] + common, "ptrain gpt fp32")
    run([sys.executable, SCRIPT, "--dataset", "synthetic-tokens", "--data", GPT_DATA, "--metrics-out", r_path] + common,
        "reference gpt fp32")
    if not check(os.path.exists(p_path) and os.path.exists(r_path), "gpt fp32: both records written"):
        return
    a, b = record(p_path)["epochs_detail"][-1], record(r_path)["epochs_detail"][-1]
    for key in ("train_loss", "test_loss"):
        difference = abs(a[key] - b[key]) / abs(a[key])
        check(difference < 1e-3, f"gpt fp32 from the same seed: {key} ptrain {a[key]:.6f}, reference {b[key]:.6f} "
                                 f"(relative difference {difference:.2g})")


def fp8_beside_amp_bf16(ptrain, out):
    import torch
    if torch.cuda.get_device_capability() < (8, 9):
        print("skip fp8: the GPU's compute capability is below 8.9", flush=True)
        return
    common = GPT + ["--seed", "3"]
    paths = {name: os.path.join(out, f"gpt-{name}.json") for name in ("ptrain-fp8", "ptrain-amp-bf16", "reference-fp8")}
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(out, "inductor"))
    for mode in ("fp8", "amp-bf16"):
        run([ptrain, "train", "--dataset", "synthetic-tokens", "--data-path", GPT_DATA, "--progress", "none",
             "--precision", mode, "--metrics-out", paths[f"ptrain-{mode}"]] + common, f"ptrain gpt {mode}")
    run([sys.executable, SCRIPT, "--dataset", "synthetic-tokens", "--data", GPT_DATA, "--precision", "fp8", "--compile",
         "--metrics-out", paths["reference-fp8"]] + common, "reference gpt fp8 compiled", env)
    if not check(all(os.path.exists(p) for p in paths.values()), "gpt fp8: every record written"):
        return
    records = {name: record(path) for name, path in paths.items()}
    layers = records["ptrain-fp8"]["extra"].get("fp8_layers", {})
    check(layers.get("fp8") == 16 and layers.get("kept_in_bf16") == 1, f"ptrain fp8: layers {layers}")
    check(records["reference-fp8"]["extra"].get("fp8_layers", {}).get("fp8") == 16, "reference fp8: 16 projections")
    base = records["ptrain-amp-bf16"]["epochs_detail"][-1]["train_loss"]
    for name in ("ptrain-fp8", "reference-fp8"):
        loss = records[name]["epochs_detail"][-1]["train_loss"]
        check(abs(loss - base) / base < 0.03, f"{name}: train loss {loss:.4f} beside ptrain amp-bf16's {base:.4f}")


def main():
    ptrain, out = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    cifar = os.path.abspath(sys.argv[3]) if len(sys.argv) > 3 and os.path.isdir(os.path.join(sys.argv[3], "train")) else ""
    os.makedirs(out, exist_ok=True)
    t0 = time.time()
    import torch
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU'}; data "
          f"{cifar or 'synthetic images'}", flush=True)
    bench(ptrain, out, cifar)
    reference_alone(out)
    same_gpt_as_ptrain(ptrain, out)
    fp8_beside_amp_bf16(ptrain, out)
    print(f"{'FAILED' if failures else 'PASSED'}: {len(failures)} failure(s), {time.time() - t0:.0f}s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
