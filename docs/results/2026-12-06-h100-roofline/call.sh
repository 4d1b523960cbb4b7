#!/usr/bin/env bash
# One device call, about 7 minutes: (1) batch_norm_bench at HEAD (base) against the single-pass kernels whose apply
# phase walks back from where the reduction stopped (rev), both built on the CPU machine with nvcc for sm_90 and
# carried in .gpu-bin/, interleaved twice, then Nsight Compute's DRAM bytes of every single-pass launch of each;
# meanwhile (2) ptrain and test_kernels build from this tree (the rev kernels, the MFU record); then (3) the
# batch-norm parity tests on the rev kernels, ResNet-50 amp-bf16 and GPT-2 large amp-bf16 with their MFU.
# BUDGET (seconds, default 460) and ROUNDS (of the bench pair, default 2) fit it to a shorter call.
# Needs .gpu-bin/, .gpu-deps/ (scripts/fetch-gpu-deps.sh) and .data/ (cifar10-jpg.tar.xz, r50.yaml) carried.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/r; mkdir -p $R
pack() { tar -czf $OUT/call.tgz.part -C $OUT r && mv $OUT/call.tgz.part $OUT/call.tgz; }
t0=$(date +%s); left() { echo $(( $1 - ($(date +%s) - t0) )); }
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv | tee $R/gpu.txt
(BUILD_TARGETS="ptrain test_kernels" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; echo "build rc $?" > $R/build-rc.txt) &
BP=$!
bench() { .gpu-bin/batch_norm_bench$([ $1 = rev ] && echo _rev) "${@:2}"; }
for round in $(seq 1 ${ROUNDS:-2}); do for v in base rev; do
  timeout 60 bench $v > $R/bn-$v-$round.txt 2>&1; echo "$v round $round rc $?"
done; done
timeout 30 bench base --phases > $R/bn-phases.txt 2>&1
for f in $R/bn-*-[12].txt; do echo "== $f"; grep -E "^total|^# of the" "$f"; done
pack
wait $BP; cat $R/build-rc.txt; tail -n 3 $R/build.txt
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
echo "build done $(( $(date +%s) - t0 )) s"
timeout 90 ./build-gpu/tests/kernels/test_kernels --gtest_filter='FusedBatchNorm*:FusedShortcut*:FusedKernels*:FusedMaxPool2d*:ConvBatchNorm*' > $R/tests.txt 2>&1
echo "tests rc $? at $(( $(date +%s) - t0 )) s"; grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure" $R/tests.txt | head -20; pack
mfu() { python3 -c "
import json,sys;r=json.load(open(sys.argv[1]))
print(' steady', r.get('steady_images_per_second'), 'tok/s', r.get('steady_tokens_per_second'), 'flops/step', r.get('model_flops_per_step'), 'tflops', r.get('tflops'), 'mfu', r.get('mfu'), 'peak', r.get('peak_tflops'), r.get('peak_tflops_basis'))" $1 2>&1 | cut -c1-400; }
[ $(left ${BUDGET:-460}) -gt 50 ] && { timeout 50 build-gpu/ptrain train --config .data/r50.yaml --precision amp-bf16 --progress lines --log-every 10 --metrics-out $R/r50-amp-bf16.json > $R/r50-amp-bf16.log 2>&1; echo "r50 rc $?"; grep -E "mfu|model FLOPs|result: model" $R/r50-amp-bf16.log | tail -n 3; mfu $R/r50-amp-bf16.json; pack; }
[ $(left ${BUDGET:-460}) -gt 60 ] && { timeout 60 build-gpu/ptrain train --model gpt-large --dataset synthetic-tokens --data-path 240:1024:50257 --batch-size 8 --epochs 1 --max-steps 30 --test-limit 16 --optimizer adamw --lr 3e-4 --warmup-steps 5 --schedule cosine --precision amp-bf16 --progress lines --log-every 10 --metrics-out $R/gpt-large-amp-bf16.json > $R/gpt-large.log 2>&1; echo "gpt-large rc $?"; grep -E "mfu|model FLOPs|result: model" $R/gpt-large.log | tail -n 3; mfu $R/gpt-large-amp-bf16.json; pack; }
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct
[ $(left ${BUDGET:-460}) -gt 90 ] && for v in base rev; do
  timeout 40 ncu --clock-control none --metrics $M -k regex:single_pass_forward_kernel --csv .gpu-bin/batch_norm_bench$([ $v = rev ] && echo _rev) --phases > $R/ncu-fwd-$v.csv 2>&1
  timeout 40 ncu --clock-control none --metrics $M -k regex:single_pass_backward_kernel --launch-count 120 --csv .gpu-bin/batch_norm_bench$([ $v = rev ] && echo _rev) --reps 1 > $R/ncu-bwd-$v.csv 2>&1
  echo "ncu $v rc $? at $(( $(date +%s) - t0 )) s"
done
pack
echo "end $(( $(date +%s) - t0 )) s"
