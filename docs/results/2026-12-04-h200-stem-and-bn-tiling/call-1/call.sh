#!/usr/bin/env bash
# Session 11 call 1: build; batch-norm kernel bench (bf16, fp16; cold and warm L2); profile amp-bf16 and amp-fp16.
R=$OUT/r; mkdir -p $R
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
pack() { tar -czf $OUT/call.tgz -C $OUT r; }
t0=$(date +%s)
BUILD_TARGETS="ptrain test_kernels batch_norm_bench" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; echo "build rc $?"
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
echo "build done $(( $(date +%s) - t0 )) s"; pack
for d in bf16 fp16; do
  timeout 60 build-gpu/bench/kernels/batch_norm_bench --dtype $d > $R/bench-$d-cold.txt 2>&1; echo "bench $d rc $?"
  timeout 60 build-gpu/bench/kernels/batch_norm_bench --dtype $d --warm > $R/bench-$d-warm.txt 2>&1
done
cat $R/bench-bf16-cold.txt; tail -1 $R/bench-bf16-warm.txt; tail -1 $R/bench-fp16-cold.txt; pack
echo "bench done $(( $(date +%s) - t0 )) s"
[ -d .data/cifar10/train ] || { mkdir -p .data/cifar10 && tar -xJf .data/cifar10-jpg.tar.xz -C .data/cifar10; }
for p in amp-bf16 amp-fp16; do
  PROFILE_STEPS=20:21 OUT=$R timeout 90 scripts/gpu_session.sh profile r50-$p --config .data/r50.yaml --precision $p --no-eval-each-epoch > $R/profile-$p.txt 2>&1
  grep -E "steady|busy|normalization|convolution|matmul" $R/profile-$p.txt | head -8
  python3 .data/bn_calls.py $R/trace-r50-$p.json.xz 2 > $R/calls-$p.txt 2>&1; pack
done
echo "all done $(( $(date +%s) - t0 )) s"; pack
