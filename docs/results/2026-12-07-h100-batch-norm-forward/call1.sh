#!/usr/bin/env bash
# Call 1 (about 4 minutes): where the single-pass batch-norm forward spends its time on the device, and three
# register/occupancy variants of it beside HEAD. Every binary is batch_norm_bench built on the CPU machine with
# nvcc for sm_90 (2026-12-07-h100-batch-norm-forward.md says how) and carried in .gpu-bin/:
#   bn_base   HEAD's kernels
#   bn_lb3    single_pass_forward_kernel bounded to 3 blocks a multiprocessor (80 registers, 88 B spilled)
#   bn_lb4    the same at 4 blocks (64 registers, 276 B spilled)
#   bn_ar8lb2 the apply phase issuing 8 rows' loads at once instead of 4, bounded to 2 blocks (128 registers)
# (1) the bench of each, two interleaved rounds; (2) bn_base --phases, cold and warm L2; (3) Nsight Compute's
# sections for the single-pass forward of six layers of bn_base (the launch before each layer's stamped one).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/r; mkdir -p $R
pack() { tar -czf $OUT/call1.tgz.part -C $OUT r && mv $OUT/call1.tgz.part $OUT/call1.tgz; }
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total,driver_version --format=csv | tee $R/gpu.txt
VARIANTS=${VARIANTS:-"base lb3 lb4 ar8lb2"}
for round in 1 2; do for v in $VARIANTS; do
  timeout 60 .gpu-bin/bn_$v > $R/bn-$v-$round.txt 2>&1; echo "$v round $round rc $? at $(( $(date +%s) - t0 )) s"
done; done
for f in $R/bn-*-[12].txt; do echo "== $f"; grep -E "^total|^# of the" "$f"; done
timeout 30 .gpu-bin/bn_base --phases > $R/phases-cold.txt 2>&1; echo "phases cold rc $?"
timeout 30 .gpu-bin/bn_base --phases --warm > $R/phases-warm.txt 2>&1; echo "phases warm rc $?"
tail -n 3 $R/phases-cold.txt; pack
S="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section SourceCounters"
for i in 1 12 25 44 45 3; do
  timeout 60 ncu $S -k regex:single_pass_forward_kernel --launch-skip $((2 * i)) --launch-count 1 .gpu-bin/bn_base --phases > $R/ncu-layer$i.txt 2>&1
  echo "ncu layer $i rc $? at $(( $(date +%s) - t0 )) s"
done
pack
echo "end $(( $(date +%s) - t0 )) s"
