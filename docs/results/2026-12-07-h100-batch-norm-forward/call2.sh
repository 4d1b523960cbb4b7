#!/usr/bin/env bash
# Call 2 (about 5 minutes): the finalize passes a block eight channels at a time (this tree, bn_fin), with two
# statistics-phase variants on top of it, beside HEAD's kernels (bn_base), all batch_norm_bench built on the CPU
# machine (2026-12-07-h100-batch-norm-forward.md says how) and carried in .gpu-bin/:
#   bn_fin    this tree's batch_norm.cu
#   bn_finsr8 + the statistics issuing 8 rows' loads at once instead of 4 (kStatsRows)
#   bn_finpf  + the statistics' loads asking L2 for 256-byte blocks (PTX ld.global.nc.L2::256B)
# (1) ptrain, test_kernels and batch_norm_bench build from this tree meanwhile; (2) the bench of each variant, two
# interleaved rounds, and --phases of each; (3) the kernel parity tests of this tree (all of test_kernels);
# (4) ResNet-50 amp-bf16 (.data/r50.yaml) on this tree, its steady img/s. Carry .gpu-bin .gpu-deps .data.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/r; mkdir -p $R
pack() { tar -czf $OUT/call2.tgz.part -C $OUT r && mv $OUT/call2.tgz.part $OUT/call2.tgz; }
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total,driver_version --format=csv | tee $R/gpu.txt
(BUILD_TARGETS="ptrain test_kernels batch_norm_bench" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; echo "build rc $?" > $R/build-rc.txt) &
BP=$!
[ -d .data/cifar10/train ] || (mkdir -p .data/cifar10 && tar -xJf .data/cifar10-jpg.tar.xz -C .data/cifar10) &
VARIANTS=${VARIANTS:-"base fin finsr8 finpf"}
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
