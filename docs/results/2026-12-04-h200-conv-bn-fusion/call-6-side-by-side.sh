#!/usr/bin/env bash
# Part B (the build of part A): ResNet-50 amp-fp16 and fp16 at batch 128, ptrain with and without
# --conv-bn-fusion beside PyTorch compiled with CUDA graphs (reduce-overhead), one call.
R=$OUT/r; mkdir -p $R
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
pack() { tar -czf $OUT/call.tgz -C $OUT r; }
t0=$(date +%s)
if [ ! -x build-gpu/ptrain ] || [ -n "${REBUILD:-}" ]; then
  BUILD_TARGETS="ptrain test_kernels" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; echo "build rc $?"
fi
echo "build done $(( $(date +%s) - t0 )) s"
timeout 100 ./build-gpu/tests/kernels/test_kernels --gtest_filter='Captured*:ConvBatchNorm*' > $R/tests.txt 2>&1; echo "tests rc $?"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[          \] |Failure|evaluates|actual" $R/tests.txt | head -30; pack
[ -d .data/cifar10/train ] || { mkdir -p .data/cifar10 && tar -xJf .data/cifar10-jpg.tar.xz -C .data/cifar10; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
show() { python3 -c "
import json,sys;r=json.load(open(sys.argv[1]));g=2**30
print(' steady %.1f' % (r.get('steady_images_per_second') or 0), 'alloc %.2f reserved %.2f nvml %.2f' % ((r.get('peak_allocated_bytes') or 0)/g, (r.get('peak_reserved_bytes') or 0)/g, (r.get('peak_nvml_used_bytes') or 0)/g), 'conv_bn', (r.get('kernels') or {}).get('conv_bn_fusion'))" $1 2>&1 | cut -c1-300; }
for P in amp-fp16 fp16; do
  for F in conv-bn-fusion no-conv-bn-fusion; do
    n=ptrain-$P-$F
    timeout 120 build-gpu/ptrain train --config .data/r50.yaml --precision $P --$F --progress none --metrics-out $R/$n.json > $R/$n.log 2>&1
    echo "$n rc=$?"; show $R/$n.json
  done
  n=pytorch-$P-graphs
  timeout 200 python3 bench/pytorch_reference.py --precision $P --model resnet50 --dataset cifar10 --data .data/cifar10 \
    --image-size 224 --batch-size 128 --max-steps 30 --train-limit 3840 --test-limit 256 --channels-last --compile \
    --compile-mode reduce-overhead --fused-optimizer --metrics-out $R/$n.json > $R/$n.log 2>&1
  echo "$n rc=$?"; show $R/$n.json; pack
done
echo "all done $(( $(date +%s) - t0 )) s"; pack
