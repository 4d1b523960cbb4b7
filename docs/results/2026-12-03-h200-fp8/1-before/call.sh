#!/usr/bin/env bash
# FP8: the kernel tests, then GPT-2 small and large in amp-bf16 and fp8 (single device, captured).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/r; mkdir -p $R
pack() { tar -czf $OUT/call.tgz -C $OUT r; }
t0=$(date +%s)
BUILD_TARGETS="${TARGETS:-ptrain test_kernels}" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; tail -3 $R/build.txt
echo "build done $(( $(date +%s) - t0 )) s"; pack
timeout 200 build-gpu/tests/kernels/test_kernels --gtest_filter="${KTEST:-*Fp8*:*FP8*}" > $R/ktest.log 2>&1; echo "ktest rc=$?"
grep -E "^\[  (FAILED|PASSED|SKIPPED|  OK) |Failure|rror|Expected|Which is|actual" $R/ktest.log | grep -v "^\[W" | head -30; pack
show() { python3 -c "import json,sys;r=json.load(open(sys.argv[1]));g=2**30;print(' steady tok/s', round(r.get('steady_tokens_per_second') or 0), 'seq/s', round(r.get('steady_images_per_second') or 0), 'alloc %.2f nvml %.2f GiB' % ((r.get('peak_allocated_bytes') or 0)/g, (r.get('peak_nvml_used_bytes') or 0)/g), 'graphs:', r.get('cuda_graphs'), r.get('cuda_graphs_note') or '', 'loss', r.get('final_train_loss'), 'fp8:', (r.get('extra') or {}).get('fp8_layers'))" $1 2>&1 | cut -c1-400; }
run() { local name=$1; shift; local st=$(date +%s); timeout ${RUN_TIMEOUT:-120} "$@" --metrics-out $R/$name.json > $R/$name.log 2>&1; echo "$name rc=$? $(( $(date +%s) - st )) s"; show $R/$name.json; grep -iE "error|fp8" $R/$name.log | head -3 | cut -c1-300; pack; }
for m in ${MODELS:-gpt-small gpt-large}; do
  B=16; [ $m = gpt-large ] && B=${LARGE_BATCH:-8}
  for p in amp-bf16 fp8; do
    run $m-$p build-gpu/ptrain train --model $m --dataset synthetic-tokens --data-path 480:1024:50257 --batch-size $B --epochs 1 --max-steps ${STEPS:-25} --test-limit 16 --optimizer adamw --lr 3e-4 --warmup-steps 5 --no-eval-each-epoch --progress none --precision $p
  done
done
echo "all done $(( $(date +%s) - t0 )) s"; pack
L="build-gpu/ptrain launch --nproc-per-node 1 -- build-gpu/ptrain"
GPT="train --model gpt-small --dataset synthetic-tokens --data-path 800:1024:50257 --batch-size 16 --epochs 1 --max-steps 40 --test-limit 32 --optimizer adamw --lr 6e-4 --warmup-steps 5 --no-eval-each-epoch --progress none --precision amp-bf16"
for spec in ${RUNS:-}; do
  IFS=: read name s envs <<< "$spec"
  envarg=""; [ -n "$envs" ] && envarg=$(echo $envs | tr ',' ' ')
  run $name env $envarg $L $GPT --strategy $s
done
echo "all done $(( $(date +%s) - t0 )) s"; pack
