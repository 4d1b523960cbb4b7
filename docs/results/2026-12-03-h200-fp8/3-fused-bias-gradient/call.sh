#!/usr/bin/env bash
# FP8 with the bias epilogue and the fused bias gradient: kernel tests, gpt-large/xl, fp8 under the strategies,
# then the fp8 bench suite (ptrain beside PyTorch compiled) until the call's time runs out.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/r; mkdir -p $R
pack() { tar -czf $OUT/call.tgz -C $OUT r; }
t0=$(date +%s)
BUILD_TARGETS="ptrain test_kernels" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; tail -2 $R/build.txt
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
echo "build done $(( $(date +%s) - t0 )) s"; pack
timeout 120 build-gpu/tests/kernels/test_kernels --gtest_filter='*Fp8*:*FP8*' > $R/ktest.log 2>&1; echo "ktest rc=$?"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|Expected|Which is|relative|differ" $R/ktest.log | head -30; pack
show() { python3 -c "import json,sys;r=json.load(open(sys.argv[1]));g=2**30;print(' steady tok/s', round(r.get('steady_tokens_per_second') or 0), 'alloc %.2f nvml %.2f GiB' % ((r.get('peak_allocated_bytes') or 0)/g, (r.get('peak_nvml_used_bytes') or 0)/g), 'graphs:', r.get('cuda_graphs'), (r.get('cuda_graphs_note') or '')[:80], 'test loss', r.get('final_test_loss'), 'fp8:', (r.get('extra') or {}).get('fp8_layers'))" $1 2>&1 | cut -c1-400; }
run() { local name=$1; shift; local st=$(date +%s); timeout 150 "$@" --metrics-out $R/$name.json > $R/$name.log 2>&1; echo "$name rc=$? $(( $(date +%s) - st )) s"; show $R/$name.json; grep -iE "error" $R/$name.log | head -3 | cut -c1-300; pack; }
G="--dataset synthetic-tokens --data-path 480:1024:50257 --epochs 1 --max-steps 25 --test-limit 16 --optimizer adamw --lr 3e-4 --warmup-steps 5 --no-eval-each-epoch --progress none"
for p in amp-bf16 fp8 fp8+head; do
  extra=""; [[ $p == *+head ]] && extra="--fp8-head"
  run large-$p build-gpu/ptrain train --model gpt-large --batch-size 8 $G --precision ${p%%+*} $extra
done
run xl-fp8+head build-gpu/ptrain train --model gpt-xl --batch-size 8 $G --precision fp8 --fp8-head
for s in ddp zero2 zero3 fsdp; do
  run small-fp8-$s build-gpu/ptrain launch --nproc-per-node 1 -- build-gpu/ptrain train --model gpt-small --batch-size 16 $G --precision fp8 --strategy $s
done
left=$(( 440 - ($(date +%s) - t0) )); echo "bench with $left s"
build-gpu/ptrain bench --suite fp8 --pytorch --no-estimate --time-limit $left --run-timeout 240 --out .bench/fp8 > $R/bench.log 2>&1
tail -25 $R/bench.log | cut -c1-250
tar -czf $OUT/bench-fp8.tgz .bench/fp8 --exclude='pytorch-cache' 2>/dev/null
echo "all done $(( $(date +%s) - t0 )) s"; pack
