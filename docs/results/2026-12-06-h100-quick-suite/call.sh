#!/usr/bin/env bash
# One device call (the bench itself at most 540 s): the quick standard comparison beside PyTorch eager on one H100,
# `ptrain bench --suite quick --pytorch` (configs/bench/quick.yaml: the standard suite's 17 runs, 60 steps each,
# 14 of them also in PyTorch; the JIT warm-up per dtype before the clocks start), with its wall time. The CUDA driver's
# JIT cache starts empty (CUDA_CACHE_PATH in .bench), as on a fresh machine, so that the warm-up pays what a first
# bench pays. Assumes build-gpu/ptrain from an earlier call (BUILD_TARGETS="ptrain" scripts/gpu_session.sh build),
# and builds it where it is missing. Carry .gpu-deps/ and .data/ (the data is unpacked as gpu_session.sh does).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/r; mkdir -p $R
t0=$(date +%s)
if [ ! -x build-gpu/ptrain ]; then
  BUILD_TARGETS="ptrain" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; echo "build rc $? at $(( $(date +%s) - t0 )) s"
fi
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
[ -d .data/cifar10/train ] || { mkdir -p .data/cifar10 && tar -xJf .data/cifar10-jpg.tar.xz -C .data/cifar10; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv | tee $R/gpu.txt
git log -1 --format='%H %s' > $R/commit.txt 2>/dev/null
export CUDA_CACHE_PATH=$PWD/.bench/nv-cache-quick; rm -rf "$CUDA_CACHE_PATH" .bench/quick
b0=$(date +%s)
# --time-limit: no run starts after 530 s and one still going then is stopped, so that the report of what finished
# comes back inside the call; the wall time below says whether the suite fitted in 10 minutes.
TIME_LIMIT=${TIME_LIMIT:-530}  # lower when the device time left is shorter
timeout $((TIME_LIMIT + 40)) build-gpu/ptrain bench --suite quick --pytorch --out .bench/quick --run-timeout 120 --time-limit $TIME_LIMIT \
  > $R/bench.log 2>&1
echo "bench rc $? in $(( $(date +%s) - b0 )) s; call at $(( $(date +%s) - t0 )) s" | tee $R/wall.txt
grep -E "^ptrain bench: (expected|Accuracy)|^warm-up|FAILED|time-limit|^ptrain bench:.*(runs|done)" $R/bench.log | cut -c1-400
du -sh "$CUDA_CACHE_PATH" 2>/dev/null | tee $R/jit-cache.txt
python3 - .bench/quick/runs <<'PY' | tee $R/summary.txt
import json, pathlib, sys
root = pathlib.Path(sys.argv[1])
print(f"{'record':42} {'steady img/s':>12} {'whole':>7} {'spread':>7} {'peak GiB':>8} {'NVML GiB':>8} {'MFU':>6} {'util %':>6} {'wall s':>7}")
for p in sorted(root.rglob("*.json")):
    r = json.loads(p.read_text())
    if "epochs_detail" not in r: continue
    s, med, p10, p90 = (r.get(k) for k in ("steady_images_per_second", "steady_step_median_seconds",
                                           "steady_step_p10_seconds", "steady_step_p90_seconds"))
    spread = f"{(p90 - p10) / med:.1%}" if med and p10 is not None and p90 is not None else "-"
    gib = lambda v: f"{v / 2**30:.2f}" if v else "-"
    print(f"{str(p.relative_to(root))[:-5]:42} {s or 0:12,.0f} {r.get('images_per_second') or 0:7,.0f} {spread:>7} "
          f"{gib(r.get('peak_allocated_bytes')):>8} {gib(r.get('peak_nvml_used_bytes')):>8} "
          f"{(r.get('mfu') or 0):6.1%} {r.get('gpu_util_mean') or 0:6.1f} {r.get('total_wall_seconds') or 0:7.1f}")
PY
# Where call-300.sh ran earlier on this machine: each steady figure beside the same run at 300 steps.
if [ -d .bench/quick-300/runs ]; then
  python3 docs/results/2026-12-06-h100-quick-suite/compare.py .bench/quick/runs .bench/quick-300/runs | tee $R/compare.txt
fi
cp .bench/quick/report.md $R/ 2>/dev/null
tar -czf $OUT/quick.tgz -C .bench quick
