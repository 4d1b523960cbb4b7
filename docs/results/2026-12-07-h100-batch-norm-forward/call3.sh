#!/usr/bin/env bash
# Call 3 (about 4 minutes): the single-pass forward holding the first rows of each block's chunk in shared memory
# between its statistics and its apply phase (this tree, bn_held), beside the block-wise finalize alone (bn_fin,
# b34a504), HEAD before this series (bn_base), and bn_il: b34a504 with the statistics pass taking rows interleaved
# across the grid (block k, row lane l: rows k * row_lanes + l + j * chunks * row_lanes) so that the whole grid
# reads one front of memory at a time. All batch_norm_bench built on the CPU machine (2026-12-07-h100-batch-norm-forward.md says how) in .gpu-bin/.
# (1) ptrain, test_kernels and batch_norm_bench build from this tree meanwhile; (2) the bench of each variant, two
# interleaved rounds, and --phases of each; (3) all of test_kernels on this tree; (4) ResNet-50 amp-bf16
# (.data/r50.yaml), steady img/s. Carry .gpu-bin .gpu-deps .data.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/r; mkdir -p $R
pack() { tar -czf $OUT/call3.tgz.part -C $OUT r && mv $OUT/call3.tgz.part $OUT/call3.tgz; }
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total,driver_version --format=csv | tee $R/gpu.txt
(BUILD_TARGETS="ptrain test_kernels batch_norm_bench" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; echo "build rc $?" > $R/build-rc.txt) &
BP=$!
[ -d .data/cifar10/train ] || (mkdir -p .data/cifar10 && tar -xJf .data/cifar10-jpg.tar.xz -C .data/cifar10) &
VARIANTS=${VARIANTS:-"base fin held il"}
for round in 1 2; do for v in $VARIANTS; do
  timeout 60 .gpu-bin/bn_$v > $R/bn-$v-$round.txt 2>&1; echo "$v round $round rc $? at $(( $(date +%s) - t0 )) s"
done; done
for v in $VARIANTS; do timeout 30 .gpu-bin/bn_$v --phases > $R/phases-$v.txt 2>&1; echo "phases $v rc $?"; tail -n 2 $R/phases-$v.txt | head -1; done
for f in $R/bn-*-[12].txt; do echo "== $f"; grep -E "^total|^# of the" "$f"; done
pack
wait $BP; cat $R/build-rc.txt; tail -n 2 $R/build.txt
echo "build done $(( $(date +%s) - t0 )) s"
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
timeout 150 ./build-gpu/tests/kernels/test_kernels > $R/kernel-tests.log 2>&1
echo "kernel tests rc $? at $(( $(date +%s) - t0 )) s"; grep -E "^\[  (FAILED|PASSED) |Failure|tests ran" $R/kernel-tests.log | head -20; pack
timeout 60 build-gpu/ptrain train --config .data/r50.yaml --precision amp-bf16 --progress lines --log-every 10 --metrics-out $R/r50-amp-bf16.json > $R/r50-amp-bf16.log 2>&1
echo "r50 rc $? at $(( $(date +%s) - t0 )) s"
python3 -c "
import json,sys;r=json.load(open(sys.argv[1]))
print('steady img/s', r.get('steady_images_per_second'), 'mfu', r.get('mfu'))" $R/r50-amp-bf16.json 2>&1 | cut -c1-300
pack
echo "end $(( $(date +%s) - t0 )) s"
