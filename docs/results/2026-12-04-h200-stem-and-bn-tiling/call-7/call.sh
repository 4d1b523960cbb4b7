#!/usr/bin/env bash
# Session 11 call 6: 32-bit indices in max pooling, the stem's regrouping in registers; the tests; ResNet-50 in
# four modes beside PyTorch amp-bf16 (and amp-fp16) compiled with CUDA graphs; the 5-epoch workload in amp-bf16.
R=$OUT/r; mkdir -p $R
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
pack() { tar -czf $OUT/call.tgz -C $OUT r; }
t0=$(date +%s)
BUILD_TARGETS="ptrain test_kernels" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; echo "build rc $?"
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
echo "build done $(( $(date +%s) - t0 )) s"; pack
timeout 120 ./build-gpu/tests/kernels/test_kernels --gtest_filter='MaxPool*:StemConv*:FusedBatchNorm*:FusedKernels*:Captured*' > $R/tests.txt 2>&1; echo "tests rc $?"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[==|Failure|evaluates|actual|Which is" $R/tests.txt | head -30; pack
echo "tests done $(( $(date +%s) - t0 )) s"
[ -d .data/cifar10/train ] || { mkdir -p .data/cifar10 && tar -xJf .data/cifar10-jpg.tar.xz -C .data/cifar10; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
python3 -c "import torch;print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version())" >> $R/gpu.txt
show() { python3 -c "
import json,sys;r=json.load(open(sys.argv[1]));g=2**30;k=r.get('kernels') or {}
print(' steady %.1f' % (r.get('steady_images_per_second') or 0), 'alloc %.2f reserved %.2f nvml %.2f' % ((r.get('peak_allocated_bytes') or 0)/g, (r.get('peak_reserved_bytes') or 0)/g, (r.get('peak_nvml_used_bytes') or 0)/g), 'stem', k.get('stem_conv'), 'graphs', r.get('cuda_graphs'))" $1 2>&1 | cut -c1-300; }
for P in amp-bf16 bf16 amp-fp16 fp16; do
  n=ptrain-$P
  timeout 90 build-gpu/ptrain train --config .data/r50.yaml --precision $P --progress none --metrics-out $R/$n.json > $R/$n.log 2>&1
  echo "$n rc=$?"; show $R/$n.json; pack
done
pyt() {
  local P=$1 n=pytorch-$1-graphs
  timeout $2 python3 bench/pytorch_reference.py --precision $P --model resnet50 --dataset cifar10 --data .data/cifar10 \
    --image-size 224 --batch-size 128 --max-steps 30 --train-limit 3840 --test-limit 256 --channels-last --compile \
    --compile-mode reduce-overhead --fused-optimizer --metrics-out $R/$n.json > $R/$n.log 2>&1
  echo "$n rc=$?"; show $R/$n.json; pack
}
pyt amp-bf16 150
echo "pytorch done $(( $(date +%s) - t0 )) s"
OUT=$R timeout 120 scripts/gpu_session.sh reference amp-bf16 > $R/reference.txt 2>&1; grep -E "result|^epoch" $R/reference.txt | tail -n 3
echo "5 epochs done $(( $(date +%s) - t0 )) s"; pack
left=$(( 570 - ($(date +%s) - t0) ))
[ $left -gt 60 ] && pyt amp-fp16 $left
echo "all done $(( $(date +%s) - t0 )) s"; pack
