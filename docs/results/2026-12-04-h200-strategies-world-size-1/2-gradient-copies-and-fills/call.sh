#!/usr/bin/env bash
# Issue 23 A/B on GPT-2 small, world size 1: flat groups' gradients taken with one cat kernel a run (default) or a
# device copy a parameter (PTRAIN_EXP_TAKE_COPY=1); replicated gradient buffers zeroed by one fill (PTRAIN_EXP_ZEROS=1)
# or a fill a parameter (default). Untraced 100-step runs in two rounds, then single and zero3 traced.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/r; mkdir -p $R
pack() { tar -czf $OUT/call.tgz -C $OUT r; }
t0=$(date +%s)
if [ ! -x build-gpu/ptrain ] || [ -n "${REBUILD:-}" ]; then
  BUILD_TARGETS="${TARGETS:-ptrain}" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; tail -3 $R/build.txt
fi
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
echo "build done $(( $(date +%s) - t0 )) s"; pack
[ -x build-gpu/ptrain ] || exit 1
show() { python3 -c "
import json,sys;r=json.load(open(sys.argv[1]));g=2**30;p=r.get('step_phase_seconds') or {}
print(' steady %.1f' % (r.get('steady_images_per_second') or 0), 'alloc %.2f nvml %.2f' % ((r.get('peak_allocated_bytes') or 0)/g, (r.get('peak_nvml_used_bytes') or 0)/g), 'phases ms', {k: round(v*1000, 2) for k, v in p.items()})" $1 2>&1 | cut -c1-300; }
GPT="--model gpt-small --dataset synthetic-tokens --batch-size 16 --epochs 1 --test-limit 32 --optimizer adamw --lr 6e-4 --warmup-steps 5 --no-eval-each-epoch --progress none --precision amp-bf16"
run() {  # NAME STRATEGY STEPS [more flags]
  local name=$1 s=$2 steps=$3; shift 3
  local L="build-gpu/ptrain launch --nproc-per-node 1 --"; [ $s = single ] && L=""
  timeout 120 $L build-gpu/ptrain train $GPT --data-path $((steps * 16)):1024:50257 --max-steps $steps --strategy $s "$@" \
    --metrics-out $R/$name.json > $R/$name.log 2>&1
  echo "$name rc=$?"; show $R/$name.json
}
for round in 1 2; do
  run single-$round single 100
  run zero3-cat-$round zero3 100
  PTRAIN_EXP_TAKE_COPY=1 run zero3-copy-$round zero3 100
  run zero2-cat-$round zero2 100
  PTRAIN_EXP_TAKE_COPY=1 run zero2-copy-$round zero2 100
  run ddp-$round ddp 100
  PTRAIN_EXP_ZEROS=1 run ddp-zeros-$round ddp 100
  pack
done
for S in single zero3; do
  run traced-$S $S 70 --profile-out $R/trace-$S.json --profile-steps 60:64
  if [ -f $R/trace-$S.json ]; then python3 scripts/trace_summary.py $R/trace-$S.json --steps 5 --top 30 > $R/summary-$S.txt 2>&1; head -12 $R/summary-$S.txt; xz -T8 -6 $R/trace-$S.json; fi
  pack
done
echo "all done $(( $(date +%s) - t0 )) s"; pack
