#!/usr/bin/env bash
# NOT RUN: five tries found no machine and the session's device time ran out. To run it, build its binaries with
# prepare_call4.sh (beside this script), apply raw.tar.xz's patches/all-from-b34a504.patch and
# patches/launch-h-from-b34a504.patch to src/ (the tree it tests), then run it.
# Call 4 (about 4 minutes): after call 3, held rows only where the layer has no residual (call 3: the residual
# layers lost 1-6 us with them), and the finalize loading each channel's parameters and running statistics before
# the partials instead of after (bn_pf). On top of it: the finalize issuing 12 chunks' loads a lane instead of 8,
# one round for up to 384 chunks (bn_pf12); the single pass's threads taking at least 8 or 4 rows each instead of
# 16, more chunks for the small layers and fewer rows a thread in turn (bn_rpt8, bn_rpt4); both (bn_all, the
# tree under test: 12 loads, 8 rows; bn_all4: 12 loads, 4 rows). Beside bn_fin (b34a504).
# (1) ptrain's test_kernels builds from this tree meanwhile; (2) two interleaved rounds of the bench, then --phases
# of each; (3) the batch-norm parity tests on this tree. Carry .gpu-bin .gpu-deps.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/r; mkdir -p $R
pack() { tar -czf $OUT/call4.tgz.part -C $OUT r && mv $OUT/call4.tgz.part $OUT/call4.tgz; }
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total,driver_version --format=csv | tee $R/gpu.txt
(BUILD_TARGETS="test_kernels" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; echo "build rc $?" > $R/build-rc.txt) &
BP=$!
VARIANTS=${VARIANTS:-"fin pf pf12 rpt8 rpt4 all all4"}
for round in 1 2; do for v in $VARIANTS; do
  timeout 60 .gpu-bin/bn_$v > $R/bn-$v-$round.txt 2>&1; echo "$v round $round rc $? at $(( $(date +%s) - t0 )) s"
done; done
for v in $VARIANTS; do timeout 30 .gpu-bin/bn_$v --phases > $R/phases-$v.txt 2>&1; echo "phases $v rc $?"; tail -n 2 $R/phases-$v.txt | head -1; done
for f in $R/bn-*-[12].txt; do echo "== $f"; grep -E "^total|^# of the" "$f"; done
pack
wait $BP; cat $R/build-rc.txt; tail -n 2 $R/build.txt
echo "build done $(( $(date +%s) - t0 )) s"
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
timeout 120 ./build-gpu/tests/kernels/test_kernels --gtest_filter='FusedBatchNorm*:FusedShortcut*:FusedKernels*:FusedMaxPool2d*:ConvBatchNorm*' > $R/kernel-tests.log 2>&1
echo "kernel tests rc $? at $(( $(date +%s) - t0 )) s"; grep -E "^\[  (FAILED|PASSED) |Failure|tests ran" $R/kernel-tests.log | head -20
pack
echo "end $(( $(date +%s) - t0 )) s"
