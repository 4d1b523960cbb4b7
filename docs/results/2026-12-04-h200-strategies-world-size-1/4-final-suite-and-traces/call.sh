#!/usr/bin/env bash
# Issue 23, the code as committed: the strategies suite at 100 steps a run, then traces of fsdp (the suite's
# per-block units) and zero3 on GPT-2 small.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/r; mkdir -p $R
pack() { tar -czf $OUT/call.tgz -C $OUT r; }
t0=$(date +%s)
BUILD_TARGETS="${TARGETS:-ptrain}" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; tail -2 $R/build.txt
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
echo "build done $(( $(date +%s) - t0 )) s"; pack
[ -x build-gpu/ptrain ] || exit 1
timeout ${LIMIT:-200} build-gpu/ptrain bench --suite strategies --no-estimate --run-timeout 60 --out $R/strategies \
  --set max-steps=100 --set gpt2-small/data-path=1600:1024:50257 --set resnet50/train-limit=12800 > $R/suite.log 2>&1
echo "suite rc=$? $(( $(date +%s) - t0 )) s"
[ -f $R/strategies/report.md ] && grep -E "^\|" $R/strategies/report.md | head -16 | cut -d'|' -f2,9,10,12,15
pack
GPT="--model gpt-small --dataset synthetic-tokens --batch-size 16 --epochs 1 --test-limit 32 --optimizer adamw --lr 6e-4 --warmup-steps 5 --no-eval-each-epoch --progress none --precision amp-bf16 --data-path 640:1024:50257 --max-steps 40"
for S in fsdp zero3; do
  extra=""; [ $S = fsdp ] && extra="--min-num-params 1000000"
  timeout 100 build-gpu/ptrain launch --nproc-per-node 1 -- build-gpu/ptrain train $GPT --strategy $S $extra \
    --profile-out $R/trace-$S.json --profile-steps 30:32 --metrics-out $R/traced-$S.json > $R/traced-$S.log 2>&1
  echo "$S traced rc=$?"
  if [ -f $R/trace-$S.json ]; then python3 scripts/trace_summary.py $R/trace-$S.json --steps 3 --top 30 > $R/summary-$S.txt 2>&1; head -10 $R/summary-$S.txt; xz -T8 -6 $R/trace-$S.json; fi
  pack
done
echo "all done $(( $(date +%s) - t0 )) s"; pack
