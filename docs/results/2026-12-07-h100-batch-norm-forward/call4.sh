#!/usr/bin/env bash
# NOT RUN (two sessions): no device machine came in eleven tries of the second, and one that came was taken back
# before the call finished. To run it, build its binaries with prepare_call4.sh (beside this script).
# Call 4 (about 3 minutes), batch_norm_bench variants, each beside bn_fin (b34a504):
#   bn_pf    held rows only where the layer has no residual (call 3: the residual layers lost 1-6 us with them), and
#            the finalize loading each channel's parameters and running statistics before the partials, not after
#   bn_pf12  + the finalize issuing 12 chunks' loads a lane instead of 8: one round for up to 384 chunks
#   bn_rpt8, bn_rpt4  bn_pf + the single pass's threads taking at least 8 or 4 rows each instead of 16 (more chunks
#            for the small layers, fewer rows a thread)
#   bn_all   12 loads and 8 rows; bn_all4: 12 loads and 4 rows
#   bn_sp    bn_all rebased on 73a09be, its statistics loop software-pipelined: the next 4 rows' loads issued before
#            this batch is folded (call 1's Nsight Compute: warps stalled on their loads 7.7 of every 14 cycles, and
#            no loads were in flight while a warp folded); 128 registers, no spills
#   bn_sps   bn_sp folding each thread's rows as sums of the values shifted by its first value, and of their
#            squares, instead of Welford's update (no division, no chain through the running mean); 125 registers
# Two interleaved rounds of the bench, then --phases of each, then fin and sps on fp32 activations (FP32_VARIANTS).
# VARIANTS picks some, the likeliest first.
# Carry .gpu-bin. Call 5 (beside it) builds and tests the tree of bn_sps.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/r; mkdir -p $R
pack() { tar -czf $OUT/call4.tgz.part -C $OUT r && mv $OUT/call4.tgz.part $OUT/call4.tgz; }
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total,driver_version --format=csv | tee $R/gpu.txt
VARIANTS=${VARIANTS:-"fin sps sp all pf pf12 rpt8 rpt4 all4"}
for round in 1 2; do for v in $VARIANTS; do
  timeout 60 .gpu-bin/bn_$v > $R/bn-$v-$round.txt 2>&1; echo "$v round $round rc $? at $(( $(date +%s) - t0 )) s"
done; done
for v in $VARIANTS; do timeout 30 .gpu-bin/bn_$v --phases > $R/phases-$v.txt 2>&1; echo "phases $v rc $?"; tail -n 2 $R/phases-$v.txt | head -1; done
# fp32 activations (tf32 and fp32 training, where compiled PyTorch's statistics pass led): FP32_VARIANTS, one round.
for v in ${FP32_VARIANTS:-fin sps}; do
  timeout 60 .gpu-bin/bn_$v --dtype fp32 > $R/bn-$v-fp32.txt 2>&1; echo "$v fp32 rc $?"; grep -E "^total" $R/bn-$v-fp32.txt
done
for f in $R/bn-*-[12].txt; do echo "== $f"; grep -E "^total|^# of the" "$f"; done
pack
echo "end $(( $(date +%s) - t0 )) s"
