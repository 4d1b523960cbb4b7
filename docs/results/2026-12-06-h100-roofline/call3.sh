#!/usr/bin/env bash
# The third call of 2026-12-06 (about 3 minutes): batch_norm_bench at HEAD before the change (base), with the
# measured patch (rev: every apply loop indexed through ThreadRows) and as committed (mix: the single pass walks
# back through ThreadRows, the two-pass kernels keep their loop), three interleaved rounds; meanwhile test_kernels
# builds from this tree, then its batch-norm parity tests run. Carry .gpu-bin/ and .gpu-deps/.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/r; mkdir -p $R
t0=$(date +%s)
(BUILD_TARGETS="test_kernels" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; echo "build rc $?" > $R/build-rc.txt) &
BP=$!
for round in 1 2 3; do for v in base rev mix; do
  b=.gpu-bin/batch_norm_bench; [ $v != base ] && b=${b}_$v
  timeout 60 $b > $R/bn-$v-$round.txt 2>&1; echo "$v round $round rc $? at $(( $(date +%s) - t0 )) s"
done; done
for f in $R/bn-*-[123].txt; do echo "== $f"; grep -E "^total" "$f"; done
wait $BP; cat $R/build-rc.txt
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
timeout 90 ./build-gpu/tests/kernels/test_kernels --gtest_filter='FusedBatchNorm*:FusedShortcut*:FusedKernels*:FusedMaxPool2d*:ConvBatchNorm*' > $R/tests.txt 2>&1
echo "tests rc $? at $(( $(date +%s) - t0 )) s"; grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure" $R/tests.txt | head -20
tar -czf $OUT/call3.tgz -C $OUT r
