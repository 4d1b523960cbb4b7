#!/usr/bin/env bash
# Session 12 call 4: the touched GPU tests three times in a row; the batch-norm bench in fp32; ResNet-50 pure bf16
# (and fp16) beside PyTorch compiled with CUDA graphs; a trace of ResNet-50 tf32.
R=$OUT/r; mkdir -p $R
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
pack() { tar -czf $OUT/call.tgz -C $OUT r; }
t0=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - t0) )); }
BUILD_TARGETS="ptrain test_kernels batch_norm_bench" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; echo "build rc $?"
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
echo "build done $(( $(date +%s) - t0 )) s"; pack
timeout 150 ./build-gpu/tests/kernels/test_kernels --gtest_repeat=3 --gtest_filter='FusedBatchNorm*:StemConv*:FusedMaxPool2d*:Captured*:FusedKernels*' > $R/tests-repeat3.txt 2>&1; echo "tests rc $?"
grep -E "^\[  (FAILED|PASSED) |Failure|Repeating" $R/tests-repeat3.txt | head -20; pack
echo "tests done $(( $(date +%s) - t0 )) s"
B=$(find build-gpu -name batch_norm_bench -type f | head -1)
timeout 40 $B --dtype fp32 > $R/bench-fp32.txt 2>&1; echo "bench rc $?"; tail -n 2 $R/bench-fp32.txt; pack
show() { python3 -c "
import json,sys;r=json.load(open(sys.argv[1]));g=2**30
print(' steady %.1f' % (r.get('steady_images_per_second') or 0), 'alloc %.2f reserved %.2f nvml %.2f' % ((r.get('peak_allocated_bytes') or 0)/g, (r.get('peak_reserved_bytes') or 0)/g, (r.get('peak_nvml_used_bytes') or 0)/g), 'graphs', r.get('cuda_graphs'))" $1 2>&1 | cut -c1-300; }
pair() {
  local P=$1
  timeout 60 build-gpu/ptrain train --config .data/r50.yaml --precision $P --progress none --metrics-out $R/ptrain-$P.json > $R/ptrain-$P.log 2>&1
  echo "ptrain-$P rc=$?"; show $R/ptrain-$P.json
  timeout $2 python3 bench/pytorch_reference.py --precision $P --model resnet50 --dataset cifar10 --data .data/cifar10 \
    --image-size 224 --batch-size 128 --max-steps 30 --train-limit 3840 --test-limit 256 --channels-last --compile \
    --compile-mode reduce-overhead --fused-optimizer --metrics-out $R/pytorch-$P-graphs.json > $R/pytorch-$P-graphs.log 2>&1
  echo "pytorch-$P-graphs rc=$?"; show $R/pytorch-$P-graphs.json; pack
}
pair bf16 140
PROFILE_STEPS=20:21 OUT=$R timeout $(left 420) scripts/gpu_session.sh profile r50-tf32 --config .data/r50.yaml --precision tf32 --no-eval-each-epoch > $R/profile.txt 2>&1
echo "profile rc $?"; sed -n 1,40p $R/summary-r50-tf32.txt | cut -c1-170; pack
[ $(left 470) -gt 150 ] && pair fp16 $(( $(left 470) - 40 ))
echo "all done $(( $(date +%s) - t0 )) s"
