#!/usr/bin/env bash
# Session 12 call 2: single pass by default, split kernels' coefficient loads back on the read-only path;
# tests, bench + variants, ResNet-50 four modes beside PyTorch compiled + CUDA graphs, trace of amp-bf16.
R=$OUT/r; mkdir -p $R
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
pack() { tar -czf $OUT/call.tgz -C $OUT r; }
t0=$(date +%s)
export PATH=$PATH:/usr/local/cuda/bin
.data/variants2.sh v1 's/kSinglePassRowsPerThread = 16/kSinglePassRowsPerThread = 8/' \
  v2 's/kSinglePassRowsPerThread = 16/kSinglePassRowsPerThread = 32/' \
  v3 's/kSinglePassApplyRows = 4/kSinglePassApplyRows = 8/;s/kSinglePassBackwardRows = 2/kSinglePassBackwardRows = 4/' > $R/variants.txt 2>&1 &
BUILD_TARGETS="ptrain test_kernels batch_norm_bench" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; echo "build rc $?"
wait
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
echo "build done $(( $(date +%s) - t0 )) s"; cat $R/variants.txt; pack
timeout 150 ./build-gpu/tests/kernels/test_kernels --gtest_filter='FusedBatchNorm*:FusedKernels*:Captured*:StemConv*:FusedMaxPool2d*:ConvBatchNorm*' > $R/tests.txt 2>&1; echo "tests rc $?"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[==|Failure|evaluates|actual|Which is|Expected|error" $R/tests.txt | head -30; pack
echo "tests done $(( $(date +%s) - t0 )) s"
B=$(find build-gpu -name batch_norm_bench -type f | head -1)
timeout 60 $B --dtype bf16 > $R/bench-bf16.txt 2>&1; echo "bench rc $?"; tail -n 2 $R/bench-bf16.txt
for v in v1 v2 v3; do [ -x build-var/bnb-$v ] && timeout 60 build-var/bnb-$v --dtype bf16 > $R/bench-bf16-$v.txt 2>&1; echo "$v"; tail -n 2 $R/bench-bf16-$v.txt; done
pack
echo "bench done $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
python3 -c "import torch;print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version())" >> $R/gpu.txt
show() { python3 -c "
import json,sys;r=json.load(open(sys.argv[1]));g=2**30
print(' steady %.1f' % (r.get('steady_images_per_second') or 0), 'alloc %.2f reserved %.2f nvml %.2f' % ((r.get('peak_allocated_bytes') or 0)/g, (r.get('peak_reserved_bytes') or 0)/g, (r.get('peak_nvml_used_bytes') or 0)/g), 'graphs', r.get('cuda_graphs'))" $1 2>&1 | cut -c1-300; }
for P in amp-bf16 bf16 amp-fp16 fp16; do
  n=ptrain-$P
  timeout 90 build-gpu/ptrain train --config .data/r50.yaml --precision $P --progress none --metrics-out $R/$n.json > $R/$n.log 2>&1
  echo "$n rc=$?"; show $R/$n.json; grep -iE "error|fail" $R/$n.log | head -5; pack
done
pyt() {
  local P=$1 n=pytorch-$1-graphs
  timeout $2 python3 bench/pytorch_reference.py --precision $P --model resnet50 --dataset cifar10 --data .data/cifar10 \
    --image-size 224 --batch-size 128 --max-steps 30 --train-limit 3840 --test-limit 256 --channels-last --compile \
    --compile-mode reduce-overhead --fused-optimizer --metrics-out $R/$n.json > $R/$n.log 2>&1
  echo "$n rc=$?"; show $R/$n.json; pack
}
pyt amp-bf16 150
pyt amp-fp16 150
echo "pytorch done $(( $(date +%s) - t0 )) s"
PROFILE_STEPS=20:21 OUT=$R timeout 100 scripts/gpu_session.sh profile r50-amp-bf16 --config .data/r50.yaml --precision amp-bf16 --no-eval-each-epoch > $R/profile.txt 2>&1
echo "profile rc $?"; sed -n 1,12p $R/summary-r50-amp-bf16.txt; grep -E "batch_norm|single_pass|apply_kernel|reduce_kernel|finalize|stats_kernel" $R/summary-r50-amp-bf16.txt | cut -c1-150; pack
echo "all done $(( $(date +%s) - t0 )) s"
