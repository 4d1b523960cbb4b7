#!/usr/bin/env bash
# The committed head: build, the fusion's parity tests and the captured step, one amp-fp16 run with the fusion.
R=$OUT/r; mkdir -p $R
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
pack() { tar -czf $OUT/call.tgz -C $OUT r; }
t0=$(date +%s)
git rev-parse HEAD > $R/commit.txt 2>&1
BUILD_TARGETS="ptrain test_kernels" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; echo "build rc $?"
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
echo "build done $(( $(date +%s) - t0 )) s"; pack
timeout 90 ./build-gpu/tests/kernels/test_kernels --gtest_filter='ConvBatchNorm*:ConvStats*:CapturedStep.TrainsLikeTheEagerStep' > $R/tests.txt 2>&1; echo "tests rc $?"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[          \] |Failure" $R/tests.txt | head -20; pack
[ -d .data/cifar10/train ] || { mkdir -p .data/cifar10 && tar -xJf .data/cifar10-jpg.tar.xz -C .data/cifar10; }
timeout 40 build-gpu/ptrain train --config .data/r50.yaml --precision amp-fp16 --progress none --metrics-out $R/amp-fp16.json > $R/amp-fp16.log 2>&1
echo "amp-fp16 rc=$?"; tail -3 $R/amp-fp16.log | cut -c1-250
echo "all done $(( $(date +%s) - t0 )) s"; pack
