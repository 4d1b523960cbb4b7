#!/usr/bin/env bash
# Session 13 call 1: a1a0c77's GPU tests and bench; amp-bf16 with and without --relu-recompute; fp16 beside
# PyTorch compiled with CUDA graphs; a trace of PyTorch compiled (default mode) in tf32.
R=$OUT/r; mkdir -p $R
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
pack() { tar -czf $OUT/call.tgz -C $OUT r; }
t0=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - t0) )); }
BUILD_TARGETS="ptrain test_kernels batch_norm_bench" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; echo "build rc $?"
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
echo "build done $(( $(date +%s) - t0 )) s"; pack
timeout 100 ./build-gpu/tests/kernels/test_kernels --gtest_filter='FusedBatchNorm*:Captured*:FusedKernels*' > $R/tests.txt 2>&1; echo "tests rc $?"
grep -E "^\[  (FAILED|PASSED) |Failure" $R/tests.txt | head -20; pack
B=$(find build-gpu -name batch_norm_bench -type f | head -1)
timeout 40 $B --dtype bf16 > $R/bench-bf16.txt 2>&1; echo "bench rc $?"; tail -n 2 $R/bench-bf16.txt; pack
show() { python3 -c "
import json,sys;r=json.load(open(sys.argv[1]));g=2**30
print(' steady %.1f' % (r.get('steady_images_per_second') or 0), 'alloc %.2f reserved %.2f nvml %.2f' % ((r.get('peak_allocated_bytes') or 0)/g, (r.get('peak_reserved_bytes') or 0)/g, (r.get('peak_nvml_used_bytes') or 0)/g), 'graphs', r.get('cuda_graphs'))" $1 2>&1 | cut -c1-300; }
ptr() {
  local N=$1; shift
  timeout 60 build-gpu/ptrain train --config .data/r50.yaml --progress none --metrics-out $R/ptrain-$N.json "$@" > $R/ptrain-$N.log 2>&1
  echo "ptrain-$N rc=$?"; show $R/ptrain-$N.json; pack
}
pyt() {
  local P=$1 T=$2
  timeout $T python3 bench/pytorch_reference.py --precision $P --model resnet50 --dataset cifar10 --data .data/cifar10 \
    --image-size 224 --batch-size 128 --max-steps 30 --train-limit 3840 --test-limit 256 --channels-last --compile \
    --compile-mode reduce-overhead --fused-optimizer --metrics-out $R/pytorch-$P-graphs.json > $R/pytorch-$P-graphs.log 2>&1
  echo "pytorch-$P-graphs rc=$?"; show $R/pytorch-$P-graphs.json; pack
}
ptr amp-bf16 --precision amp-bf16
ptr amp-bf16-keep --precision amp-bf16 --no-relu-recompute
ptr fp16 --precision fp16
pyt fp16 140
echo "pytorch profile at $(( $(date +%s) - t0 )) s"
timeout $(left 520) python3 scripts/profile_pytorch_reference.py --trace-out $R/trace-pytorch-tf32.json bench/pytorch_reference.py \
  --data .data/cifar10 --precision tf32 --model resnet50 --dataset cifar10 --image-size 224 --batch-size 128 \
  --channels-last --compile --fused-optimizer --max-steps 20 --epochs 1 --train-limit 2560 --test-limit 128 --no-eval \
  > $R/profile-pytorch-tf32.txt 2>&1; echo "pytorch profile rc $?"
grep -E "per step|ms  x" $R/profile-pytorch-tf32.txt | head -30 | cut -c1-160
python3 scripts/trace_summary.py $R/trace-pytorch-tf32.json --steps 5 --top 30 > $R/summary-pytorch-tf32.txt 2>&1
sed -n 1,30p $R/summary-pytorch-tf32.txt | cut -c1-170; xz -T4 -6 $R/trace-pytorch-tf32.json; pack
echo "all done $(( $(date +%s) - t0 )) s"
