#!/usr/bin/env bash
# Issue 23: NCCL's own device memory at world size 1 under its settings, and traces of the captured GPT-2 small
# step under single, zero2 and zero3 (steps 30-32), world size 1 over NCCL.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/r; mkdir -p $R
pack() { tar -czf $OUT/call.tgz -C $OUT r; }
t0=$(date +%s)
bash .data/ncclvariants.sh $R/nccl-alloc.log > $R/nccl-variants.txt 2>&1; cat $R/nccl-variants.txt | cut -c1-400; pack
echo "probe done $(( $(date +%s) - t0 )) s"
BUILD_TARGETS="${TARGETS:-ptrain}" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; tail -3 $R/build.txt
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
echo "build done $(( $(date +%s) - t0 )) s"; pack
show() { python3 -c "import json,sys;r=json.load(open(sys.argv[1]));g=2**30;print(' steady seq/s', r.get('steady_images_per_second'), 'alloc %.2f reserved %.2f nvml %.2f GiB' % ((r.get('peak_allocated_bytes') or 0)/g, (r.get('peak_reserved_bytes') or 0)/g, (r.get('peak_nvml_used_bytes') or 0)/g), 'graphs:', r.get('cuda_graphs'), r.get('cuda_graphs_note') or '', 'phases', r.get('step_phase_seconds'))" $1 2>&1 | cut -c1-500; }
GPT="--model gpt-small --dataset synthetic-tokens --data-path 800:1024:50257 --batch-size 16 --epochs 1 --max-steps 40 --test-limit 32 --optimizer adamw --lr 6e-4 --warmup-steps 5 --no-eval-each-epoch --progress none --precision amp-bf16"
for S in ${STRATS:-single zero2 zero3}; do
  st=$(date +%s)
  prof=""; [ -n "${TRACE:-1}" ] && prof="--profile-out $R/trace-$S.json --profile-steps 30:32"
  L="build-gpu/ptrain launch --nproc-per-node 1 --"; [ $S = single ] && L=""
  timeout 200 $L build-gpu/ptrain train $GPT --strategy $S $prof --metrics-out $R/$S.json > $R/$S.log 2>&1
  echo "$S rc=$? $(( $(date +%s) - st )) s"; show $R/$S.json; grep -iE "error" $R/$S.log | head -3 | cut -c1-300
  if [ -f $R/trace-$S.json ]; then python3 scripts/trace_summary.py $R/trace-$S.json --steps 3 --top 30 > $R/summary-$S.txt 2>&1; head -40 $R/summary-$S.txt; xz -T8 -6 $R/trace-$S.json; fi
  pack
done
echo "all done $(( $(date +%s) - t0 )) s"; pack
