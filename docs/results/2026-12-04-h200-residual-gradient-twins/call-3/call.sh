#!/usr/bin/env bash
# Session 13 call 3: the residual gradients summed by the batch-norm backward (twins): bench, GPU tests, ResNet-50
# in every half mode and tf32, PyTorch compiled with CUDA graphs in amp-bf16, a trace of amp-bf16.
R=$OUT/r; mkdir -p $R
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
pack() { tar -czf $OUT/call.tgz -C $OUT r; }
t0=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - t0) )); }
(BUILD_TARGETS="ptrain test_kernels batch_norm_bench" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; echo "build rc $?" > $R/build-rc.txt) &
BP=$!
timeout 60 .data/var/bnb-twin --dtype bf16 > $R/bench-bf16.txt 2>&1; echo "bench bf16 rc $?"; tail -n 3 $R/bench-bf16.txt
timeout 60 .data/var/bnb-twin --dtype fp32 > $R/bench-fp32.txt 2>&1; echo "bench fp32 rc $?"; tail -n 3 $R/bench-fp32.txt
pack
wait $BP; cat $R/build-rc.txt
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
echo "build done $(( $(date +%s) - t0 )) s"
timeout 150 ./build-gpu/tests/kernels/test_kernels --gtest_filter='FusedBatchNorm*:FusedKernels*:Captured*:ConvBatchNorm*:ConvStats*' > $R/tests.txt 2>&1; echo "tests rc $?"
grep -E "^\[  (FAILED|PASSED) |Failure|Expected|Which is|error" $R/tests.txt | head -30; pack
show() { python3 -c "
import json,sys;r=json.load(open(sys.argv[1]));g=2**30
print(' steady %.1f' % (r.get('steady_images_per_second') or 0), 'alloc %.2f reserved %.2f nvml %.2f' % ((r.get('peak_allocated_bytes') or 0)/g, (r.get('peak_reserved_bytes') or 0)/g, (r.get('peak_nvml_used_bytes') or 0)/g), 'graphs', r.get('cuda_graphs'), 'loss', r.get('final_train_loss'))" $1 2>&1 | cut -c1-300; }
ptr() {
  local N=$1; shift
  timeout 60 build-gpu/ptrain train --config .data/r50.yaml --progress none --metrics-out $R/ptrain-$N.json "$@" > $R/ptrain-$N.log 2>&1
  echo "ptrain-$N rc=$?"; show $R/ptrain-$N.json; pack
}
for P in amp-bf16 bf16 amp-fp16 fp16 tf32; do ptr $P --precision $P; done
PROFILE_STEPS=20:21 OUT=$R timeout 120 scripts/gpu_session.sh profile r50-amp-bf16 --config .data/r50.yaml --precision amp-bf16 --no-eval-each-epoch > $R/profile.txt 2>&1
echo "profile rc $?"; sed -n 1,45p $R/summary-r50-amp-bf16.txt | cut -c1-170; pack
if [ $(left 560) -gt 120 ]; then
  timeout $(left 560) python3 bench/pytorch_reference.py --precision amp-bf16 --model resnet50 --dataset cifar10 --data .data/cifar10 \
    --image-size 224 --batch-size 128 --max-steps 30 --train-limit 3840 --test-limit 256 --channels-last --compile \
    --compile-mode reduce-overhead --fused-optimizer --metrics-out $R/pytorch-amp-bf16-graphs.json > $R/pytorch-amp-bf16-graphs.log 2>&1
  echo "pytorch-amp-bf16-graphs rc=$?"; show $R/pytorch-amp-bf16-graphs.json; pack
fi
echo "all done $(( $(date +%s) - t0 )) s"
