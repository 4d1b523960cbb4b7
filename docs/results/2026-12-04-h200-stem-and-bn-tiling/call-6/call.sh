#!/usr/bin/env bash
# Session 11 call 5: build the stem's space-to-depth form and the reduction tiling; their tests; the bench;
# ResNet-50 amp-bf16, bf16 and amp-fp16 beside PyTorch amp-bf16 compiled with CUDA graphs; a trace of amp-bf16.
R=$OUT/r; mkdir -p $R
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
pack() { tar -czf $OUT/call.tgz -C $OUT r; }
t0=$(date +%s)
BUILD_TARGETS="ptrain test_kernels batch_norm_bench" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; echo "build rc $?"
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
echo "build done $(( $(date +%s) - t0 )) s"; pack
timeout 150 ./build-gpu/tests/kernels/test_kernels --gtest_filter='StemConv*:FusedBatchNorm*:FusedKernels*:Captured*:ConvBatchNorm*:ConvStats*' > $R/tests.txt 2>&1; echo "tests rc $?"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[==|Failure|evaluates|actual|Which is" $R/tests.txt | head -30; pack
echo "tests done $(( $(date +%s) - t0 )) s"
build-gpu/bench/kernels/batch_norm_bench --dtype bf16 --warm > $R/bench-bf16-warm.txt 2>&1; tail -1 $R/bench-bf16-warm.txt
build-gpu/bench/kernels/batch_norm_bench --dtype bf16 > $R/bench-bf16-cold.txt 2>&1; tail -1 $R/bench-bf16-cold.txt
[ -d .data/cifar10/train ] || { mkdir -p .data/cifar10 && tar -xJf .data/cifar10-jpg.tar.xz -C .data/cifar10; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
show() { python3 -c "
import json,sys;r=json.load(open(sys.argv[1]));g=2**30;k=r.get('kernels') or {}
print(' steady %.1f' % (r.get('steady_images_per_second') or 0), 'alloc %.2f reserved %.2f nvml %.2f' % ((r.get('peak_allocated_bytes') or 0)/g, (r.get('peak_reserved_bytes') or 0)/g, (r.get('peak_nvml_used_bytes') or 0)/g), 'stem', k.get('stem_conv'), 'graphs', r.get('cuda_graphs'), 'loss', r.get('final_train_loss'))" $1 2>&1 | cut -c1-300; }
for P in amp-bf16 bf16 amp-fp16; do
  n=ptrain-$P
  timeout 100 build-gpu/ptrain train --config .data/r50.yaml --precision $P --progress none --metrics-out $R/$n.json > $R/$n.log 2>&1
  echo "$n rc=$?"; show $R/$n.json; pack
done
n=pytorch-amp-bf16-graphs
timeout 200 python3 bench/pytorch_reference.py --precision amp-bf16 --model resnet50 --dataset cifar10 --data .data/cifar10 \
  --image-size 224 --batch-size 128 --max-steps 30 --train-limit 3840 --test-limit 256 --channels-last --compile \
  --compile-mode reduce-overhead --fused-optimizer --metrics-out $R/$n.json > $R/$n.log 2>&1
echo "$n rc=$?"; show $R/$n.json; pack
echo "pytorch done $(( $(date +%s) - t0 )) s"
PROFILE_STEPS=20:21 OUT=$R timeout 80 scripts/gpu_session.sh profile r50-amp-bf16 --config .data/r50.yaml --precision amp-bf16 --no-eval-each-epoch > $R/profile-amp-bf16.txt 2>&1
grep -E "busy|normalization|convolution|matmul" $R/profile-amp-bf16.txt | head -6
python3 .data/bn_calls.py $R/trace-r50-amp-bf16.json.xz 2 > $R/calls-amp-bf16.txt 2>&1
echo "all done $(( $(date +%s) - t0 )) s"; pack
