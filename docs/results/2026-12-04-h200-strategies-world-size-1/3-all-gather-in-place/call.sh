#!/usr/bin/env bash
# Issue 23: zero3's and fsdp's all-gathers in place (this rank's shard copied into its slot, FSDP2's way; default)
# against out of place (PTRAIN_EXP_AG_OLD=1), GPT-2 small amp-bf16 at world size 1, two rounds of 100-step runs;
# then the strategies suite at 100 steps a run, and traces of zero2 and fsdp (the suite's per-block units).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/r; mkdir -p $R
pack() { tar -czf $OUT/call.tgz -C $OUT r; }
t0=$(date +%s)
BUILD_TARGETS="${TARGETS:-ptrain}" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; tail -2 $R/build.txt
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
  run zero3-inplace-$round zero3 100
  PTRAIN_EXP_AG_OLD=1 run zero3-old-$round zero3 100
  run fsdp-inplace-$round fsdp 100 --min-num-params 1000000
  PTRAIN_EXP_AG_OLD=1 run fsdp-old-$round fsdp 100 --min-num-params 1000000
  pack
done
echo "A/B done $(( $(date +%s) - t0 )) s"
timeout ${LIMIT:-200} build-gpu/ptrain bench --suite strategies --no-estimate --run-timeout 60 --out $R/strategies \
  --set max-steps=100 --set gpt2-small/data-path=1600:1024:50257 --set resnet50/train-limit=12800 > $R/suite.log 2>&1
echo "suite rc=$? $(( $(date +%s) - t0 )) s"
[ -f $R/strategies/report.md ] && grep -E "^\|" $R/strategies/report.md | head -16 | cut -d'|' -f2,9,10,12,15
pack
for S in zero2 fsdp; do
  extra=""; [ $S = fsdp ] && extra="--min-num-params 1000000"
  run traced-$S $S 40 $extra --profile-out $R/trace-$S.json --profile-steps 30:32
  if [ -f $R/trace-$S.json ]; then python3 scripts/trace_summary.py $R/trace-$S.json --steps 3 --top 30 > $R/summary-$S.txt 2>&1; head -10 $R/summary-$S.txt; xz -T8 -6 $R/trace-$S.json; fi
  pack
done
echo "all done $(( $(date +%s) - t0 )) s"; pack
