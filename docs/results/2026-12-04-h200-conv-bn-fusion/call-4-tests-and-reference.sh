#!/usr/bin/env bash
# Part A: build, the parity tests, the 5-epoch reference workload in fp16 + master weights (fusion on).
R=$OUT/r; mkdir -p $R
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
pack() { tar -czf $OUT/call.tgz -C $OUT r; }
t0=$(date +%s)
BUILD_TARGETS="ptrain test_kernels" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; echo "build rc $?"
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
echo "build done $(( $(date +%s) - t0 )) s"
timeout 240 ./build-gpu/tests/kernels/test_kernels --gtest_filter='ConvBatchNorm*:ConvStats*:Captured*:FusedKernels*:FusedBatchNorm*' > $R/tests.txt 2>&1; echo "tests rc $?"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[          \] |Failure|evaluates|actual" $R/tests.txt | head -40
echo "tests done $(( $(date +%s) - t0 )) s"; pack
OUT=$R timeout 200 scripts/gpu_session.sh reference fp16+master 2>&1 | tail -8
python3 -c "
import json;r=json.load(open('$R/reference-ptrain-fp16-master.json'));print('acc',r.get('final_test_accuracy'),'img/s',r.get('steady_images_per_second'),'conv_bn',r['kernels'].get('conv_bn_fusion'))" 2>&1 | tail -2
echo "all done $(( $(date +%s) - t0 )) s"; pack
