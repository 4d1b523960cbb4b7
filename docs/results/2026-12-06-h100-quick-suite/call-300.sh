#!/usr/bin/env bash
# One device call (the bench at most TIME_LIMIT = 420 s, after a build where build-gpu/ptrain is missing): five of the quick suite's runs at 300 steps instead of 60, ptrain and
# PyTorch eager, to check issue 49's bar that each quick steady figure is within 5% of the same run at 300 steps:
# fp32, fp16, amp-bf16 on one GPU, ddp amp-bf16 and fsdp amp-bf16 (one process each on one GPU). The same suite file
# (configs/bench/quick.yaml) with max-steps and train-limit set for 300 steps, the other runs skipped; the warm-up
# as in call.sh. Then compare.py puts each run's steady figure beside call.sh's, where call.sh ran earlier on this
# machine (its .bench/quick stays between calls on a warm machine); otherwise compare the two packed folders:
#   python3 compare.py quick/runs quick-300/runs
# Assumes build-gpu/ptrain from an earlier call; builds it where it is missing. Carry .gpu-deps/ and .data/.
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
export CUDA_CACHE_PATH=$PWD/.bench/nv-cache-300; rm -rf .bench/quick-300
skip=()
for run in fp16-master-single-x1 amp-fp16-single-x1 fp32-dp-x1 amp-bf16-dp-x1 fp32-ddp-x1 fp32-zero1-x1 \
           amp-bf16-zero1-x1 fp32-zero2-x1 amp-bf16-zero2-x1 fp32-zero3-x1 amp-bf16-zero3-x1 fp32-fsdp-x1; do
  skip+=(--skip "$run")
done
b0=$(date +%s)
# The limits leave room for a build in the same call (about 100 s): TIME_LIMIT=530 where build-gpu/ptrain is there.
TIME_LIMIT=${TIME_LIMIT:-420}
timeout $((TIME_LIMIT + 30)) build-gpu/ptrain bench --suite quick --pytorch --out .bench/quick-300 --run-timeout 150 \
  --time-limit $TIME_LIMIT \
  --set max-steps=300 --set train-limit=38400 "${skip[@]}" > $R/bench.log 2>&1
echo "bench rc $? in $(( $(date +%s) - b0 )) s; call at $(( $(date +%s) - t0 )) s" | tee $R/wall.txt
grep -E "^ptrain bench: expected|^warm-up|FAILED|time-limit|done:" $R/bench.log | cut -c1-300
if [ -d .bench/quick/runs ]; then
  python3 docs/results/2026-12-06-h100-quick-suite/compare.py .bench/quick/runs .bench/quick-300/runs | tee $R/compare.txt
fi
cp .bench/quick-300/report.md $R/ 2>/dev/null
tar -czf $OUT/quick-300.tgz -C .bench quick-300
