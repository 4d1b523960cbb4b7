#!/usr/bin/env bash
# --conv-bn-fusion: build, the kernel parity tests, ResNet-50 amp-fp16 and fp16 with and without the fusion.
R=$OUT/r; mkdir -p $R
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
pack() { tar -czf $OUT/call.tgz -C $OUT r; }
t0=$(date +%s)
if [ ! -x build-gpu/ptrain ] || [ -n "${REBUILD:-}" ]; then
  BUILD_TARGETS="ptrain test_kernels" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; echo "build rc $?"
  grep -E " error|Error " $R/build.txt | head -20; tail -2 $R/build.txt
fi
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
echo "build done $(( $(date +%s) - t0 )) s"
[ -x build-gpu/ptrain ] || { pack; exit 1; }
if [ -z "${NO_TESTS:-}" ]; then
timeout 300 ./build-gpu/tests/kernels/test_kernels --gtest_filter="${FILTER:-ConvBatchNorm*:ConvStats*:FusedKernels*:FusedBatchNorm*:Captured*}" > $R/tests.txt 2>&1; echo "tests rc $?"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[          \] |Failure|Expected|Which is|error|  Actual|value of" $R/tests.txt | head -60
echo "tests done $(( $(date +%s) - t0 )) s"; pack
fi
[ -n "${TESTS_ONLY:-}" ] && exit 0
[ -d .data/cifar10/train ] || { mkdir -p .data/cifar10 && tar -xJf .data/cifar10-jpg.tar.xz -C .data/cifar10; }
show() { python3 -c "
import json,sys;r=json.load(open(sys.argv[1]));g=2**30
print(' steady %.1f' % (r.get('steady_images_per_second') or 0), 'alloc %.2f nvml %.2f' % ((r.get('peak_allocated_bytes') or 0)/g, (r.get('peak_nvml_used_bytes') or 0)/g), 'graphs', r.get('cuda_graphs'), 'conv_bn', (r.get('kernels') or {}).get('conv_bn_fusion'))" $1 2>&1 | cut -c1-400; }
for round in 1 2; do for P in ${MODES:-amp-fp16 fp16}; do for F in conv-bn-fusion no-conv-bn-fusion; do
  n=$P-$F-$round
  timeout 150 build-gpu/ptrain train --config .data/r50.yaml --precision $P --$F --progress none --metrics-out $R/$n.json ${EXTRA:-} > $R/$n.log 2>&1
  echo "$n rc=$?"; show $R/$n.json; [ -f $R/$n.json ] || tail -5 $R/$n.log
done; done; done
pack
timeout 150 build-gpu/ptrain train --config .data/r50.yaml --precision amp-bf16 --progress none --metrics-out $R/amp-bf16.json > $R/amp-bf16.log 2>&1
echo "amp-bf16 rc=$?"; show $R/amp-bf16.json
echo "all done $(( $(date +%s) - t0 )) s"; pack
