#!/usr/bin/env bash
# Issue 23: where fsdp's and zero3's time goes at world size 1 on GPT-2 small: untraced 100-step runs alternating
# with single, then each traced over steps 60-64 of 70.
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
print(' steady %.1f' % (r.get('steady_images_per_second') or 0), 'alloc %.2f nvml %.2f' % ((r.get('peak_allocated_bytes') or 0)/g, (r.get('peak_nvml_used_bytes') or 0)/g), 'graphs', r.get('cuda_graphs'), 'phases ms', {k: round(v*1000, 2) for k, v in p.items()})" $1 2>&1 | cut -c1-400; }
GPT="--model gpt-small --dataset synthetic-tokens --batch-size 16 --epochs 1 --test-limit 32 --optimizer adamw --lr 6e-4 --warmup-steps 5 --no-eval-each-epoch --progress none --precision amp-bf16"
run() {  # NAME STRATEGY STEPS [more flags]
  local name=$1 s=$2 steps=$3; shift 3
  local L="build-gpu/ptrain launch --nproc-per-node 1 --"; [ $s = single ] && L=""
  timeout 120 $L build-gpu/ptrain train $GPT --data-path $((steps * 16)):1024:50257 --max-steps $steps --strategy $s "$@" \
    --metrics-out $R/$name.json > $R/$name.log 2>&1
  echo "$name rc=$?"; show $R/$name.json
}
for round in 1 2; do for S in ${STRATS:-single fsdp zero3}; do run $S-$round $S 100; done; done
run fsdpblock fsdp 100 --auto-wrap type --wrap-types Block
pack
for S in ${TSTRATS:-single fsdp zero3}; do
  run trace-$S $S 70 --profile-out $R/trace-$S.json --profile-steps 60:64
  if [ -f $R/trace-$S.json ]; then python3 scripts/trace_summary.py $R/trace-$S.json --steps 5 --top 30 > $R/summary-$S.txt 2>&1; head -4 $R/summary-$S.txt; xz -T8 -6 $R/trace-$S.json; fi
  pack
done
echo "all done $(( $(date +%s) - t0 )) s"; pack
