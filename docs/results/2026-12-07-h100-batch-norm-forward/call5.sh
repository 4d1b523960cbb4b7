#!/usr/bin/env bash
# NOT RUN, as call 4. Call 5 (about 5 minutes) tests the tree of call 4's bn_sps: 73a09be with raw.tar.xz's
# patches/tree-from-73a09be.patch and patches/launch-h-from-b34a504.patch applied (git apply, from the root). That tree holds rows where the layer has no residual, loads the finalize's parameters first, takes 12
# chunk loads a lane and 8 rows a thread, and pipelines the single pass's statistics, folded as shifted sums; the
# split reduction (64 registers) keeps its loop. test_kernels holds FusedBatchNormRelu.StatisticsHoldForAMeanFarFromZero,
# which checks the shifted sums where they could go wrong: a mean of 1000 and a spread of 0.1.
# (1) ptrain, test_kernels and batch_norm_bench build from this tree (BUILT=1: the caller built build-gpu beside
# call 4's bench, in the same call); (2) all of test_kernels; (3) unless SKIP_BENCH=1, this tree's batch_norm_bench
# beside bn_fin, two interleaved rounds; (4) ResNet-50 amp-bf16 (.data/r50.yaml: configs/cifar10-resnet50-224.yaml
# with max-steps: 30), its steady img/s. Carry .gpu-bin .gpu-deps .data. The two in one call, as tried:
#   D=docs/results/2026-12-07-h100-batch-norm-forward; mkdir -p $OUT/b; (BUILD_TARGETS="ptrain test_kernels" \
#   OUT=$OUT/b scripts/gpu_session.sh build > $OUT/b/build.txt 2>&1) & VARIANTS="fin sps sp all pf12 rpt4" \
#   bash $D/call4.sh; wait; BUILT=1 SKIP_BENCH=1 bash $D/call5.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/r5; mkdir -p $R
pack() { tar -czf $OUT/call5.tgz.part -C $OUT r5 && mv $OUT/call5.tgz.part $OUT/call5.tgz; }
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total,driver_version --format=csv | tee $R/gpu.txt
if [ -z "${BUILT:-}" ]; then  # BUILT=1: the caller built build-gpu already (beside call 4's bench)
  BUILD_TARGETS="ptrain test_kernels batch_norm_bench" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1
  echo "build rc $? at $(( $(date +%s) - t0 )) s"; tail -n 2 $R/build.txt
fi
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
timeout 150 ./build-gpu/tests/kernels/test_kernels > $R/kernel-tests.log 2>&1
echo "kernel tests rc $? at $(( $(date +%s) - t0 )) s"; grep -E "^\[  (FAILED|PASSED) |Failure|tests ran" $R/kernel-tests.log | head -20
pack
if [ -z "${SKIP_BENCH:-}" ]; then  # SKIP_BENCH=1: call 4 measured this tree's kernels as bn_sps
  bench=$(find build-gpu -name batch_norm_bench -type f -perm -u+x | head -1)
  for round in 1 2; do
    timeout 60 .gpu-bin/bn_fin > $R/bn-fin-$round.txt 2>&1; echo "fin round $round rc $?"
    timeout 60 $bench > $R/bn-tree-$round.txt 2>&1; echo "tree round $round rc $?"
  done
  timeout 30 $bench --phases > $R/phases-tree.txt 2>&1
  for f in $R/bn-*-[12].txt; do echo "== $f"; grep -E "^total|^# of the" "$f"; done
fi
pack
timeout 60 build-gpu/ptrain train --config .data/r50.yaml --precision amp-bf16 --progress lines --log-every 10 --metrics-out $R/r50-amp-bf16.json > $R/r50-amp-bf16.log 2>&1
echo "r50 rc $? at $(( $(date +%s) - t0 )) s"; tail -n 1 $R/r50-amp-bf16.log | cut -c1-300
pack
echo "end $(( $(date +%s) - t0 )) s"
