#!/usr/bin/env bash
# One device call (about 520 s): the GPU tests of the kernels changed since f54fa70, every ResNet-50 mode, what each
# fusion brings (--skip-fusions), PyTorch compiled + graphs in amp-bf16, the 5-epoch amp-bf16 reference.
# Needs .data/r50.yaml (2026-12-04-h200-conv-bn-fusion/r50.yaml), .data/cifar10-jpg.tar.xz, and .data/var/bn_bench_dual:
#   nvcc -std=c++17 -O3 --use_fast_math -arch=sm_90 -Isrc bench/kernels/batch_norm_bench.cu \
#     src/ptrain/kernels/cuda/batch_norm.cu src/ptrain/kernels/cuda/max_pool.cu -o .data/var/bn_bench_dual
R=$OUT/r; mkdir -p $R
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
pack() { tar -czf $OUT/call.tgz.part -C $OUT r && mv $OUT/call.tgz.part $OUT/call.tgz; }
t0=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - t0) )); }
(BUILD_TARGETS="ptrain test_kernels" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; echo "build rc $?" > $R/build-rc.txt) &
BP=$!
timeout 30 stdbuf -oL .data/var/bn_bench_dual --dtype bf16 --phases > $R/phases-bf16.txt 2>&1; echo "phases bf16 rc $?"; tail -n 3 $R/phases-bf16.txt
timeout 30 stdbuf -oL .data/var/bn_bench_dual --dtype fp32 --phases > $R/phases-fp32.txt 2>&1; echo "phases fp32 rc $?"; tail -n 3 $R/phases-fp32.txt
pack
wait $BP; cat $R/build-rc.txt; tail -n 3 $R/build.txt
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
echo "build done $(( $(date +%s) - t0 )) s"
timeout 150 ./build-gpu/tests/kernels/test_kernels --gtest_filter='FusedMaxPool2d*:ParameterCast*:FusedShortcut*:FusedBatchNorm*:FusedKernels*:GlobalAveragePool*:Captured*:ConvBatchNorm*:StemConv*' > $R/tests.txt 2>&1; echo "tests rc $? at $(( $(date +%s) - t0 )) s"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|Expected|Which is|error" $R/tests.txt | head -30; pack
show() { python3 -c "
import json,sys;r=json.load(open(sys.argv[1]));g=2**30;k=r.get('kernels') or {}
print(' steady %.1f' % (r.get('steady_images_per_second') or 0), 'alloc %.2f reserved %.2f nvml %.2f' % ((r.get('peak_allocated_bytes') or 0)/g, (r.get('peak_reserved_bytes') or 0)/g, (r.get('peak_nvml_used_bytes') or 0)/g), 'graphs', r.get('cuda_graphs'), 'loss', r.get('final_train_loss'), 'conv_bn', k.get('conv_bn_fusion'), 'skipped', k.get('skipped_fusions'), k.get('skipped_fusions_without_effect'))" $1 2>&1 | cut -c1-400; }
ptr() {
  local N=$1; shift
  [ $(left 520) -gt 40 ] || { echo "ptrain-$N skipped: no time left"; return; }
  timeout 45 build-gpu/ptrain train --config .data/r50.yaml --progress none --metrics-out $R/ptrain-$N.json "$@" > $R/ptrain-$N.log 2>&1
  echo "ptrain-$N rc=$?"; show $R/ptrain-$N.json; pack
}
for P in amp-bf16 bf16 amp-fp16 fp16 tf32; do ptr $P --precision $P; done
for F in weight-casts shortcut-norms stem-pool residual-twins; do ptr amp-bf16-no-$F --precision amp-bf16 --skip-fusions $F; done
ptr amp-bf16-again --precision amp-bf16
echo "ptrain runs done $(( $(date +%s) - t0 )) s"
if [ $(left 520) -gt 100 ]; then
  timeout $(left 520) python3 bench/pytorch_reference.py --precision amp-bf16 --model resnet50 --dataset cifar10 --data .data/cifar10 \
    --image-size 224 --batch-size 128 --max-steps 30 --train-limit 3840 --test-limit 256 --channels-last --compile \
    --compile-mode reduce-overhead --fused-optimizer --metrics-out $R/pytorch-amp-bf16-graphs.json > $R/pytorch-amp-bf16-graphs.log 2>&1
  echo "pytorch-amp-bf16-graphs rc=$?"; show $R/pytorch-amp-bf16-graphs.json; pack
fi
if [ $(left 520) -gt 95 ]; then
  OUT=$R timeout $(left 520) scripts/gpu_session.sh reference amp-bf16 > $R/reference-amp-bf16.txt 2>&1; echo "reference rc $?"
  grep -E "result|^epoch" $R/reference-amp-bf16.txt | tail -n 3; pack
fi
echo "all done $(( $(date +%s) - t0 )) s"
