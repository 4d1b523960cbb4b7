#!/usr/bin/env bash
# An eleventh device call (about 6 minutes with its build): call 10's runs after pruning removes a checkpoint's
# part files a thread each (call 10: one thread took 0.8-1.3 s to free 9.4 GB of tmpfs pages, and the next write
# waited for it). Runs (MODES, default "none async sync async-trace") of STEPS (default 160) steps; async-trace
# is a 60-step async run that traces steps 38-42 (the save at step 40) with --profile-out, to see where the
# steps around a save lose time. Then the CheckpointStaging GPU tests alone. Carry .gpu-deps/ and .data/ when it
# builds.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/r; mkdir -p $R
t0=$(date +%s)
TARGETS="ptrain"; [ "${KERNEL_TESTS:-1}" = 1 ] && TARGETS="ptrain test_kernels"
if [ ! -x build-gpu/ptrain ] || { [ "${KERNEL_TESTS:-1}" = 1 ] && [ ! -x build-gpu/tests/kernels/test_kernels ]; }; then
  BUILD_TARGETS="$TARGETS" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; echo "build rc $? at $(( $(date +%s) - t0 )) s"
fi
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
nproc | tee $R/cpu.txt; df -h /dev/shm | tee $R/shm.txt; free -g | tee -a $R/shm.txt
GPT=(--model gpt-large --dataset synthetic-tokens --data-path 2400:1024:50257 --batch-size 8 --epochs 1
     --test-limit 16 --optimizer adamw --lr 3e-4 --warmup-steps 5 --schedule cosine --precision amp-bf16
     --progress lines --log-every 20)
CK=/dev/shm/ptrain-ck
for mode in ${MODES:-none async sync async-trace}; do
  extra=(); env=(); rm -rf $CK
  [ $mode != none ] && extra=(--checkpoint-dir $CK --checkpoint-every 20 --keep-checkpoints 1)
  case $mode in async*) extra+=(--async-checkpoint);; esac
  [ $mode = async-1file ] && env=(PTRAIN_TEST_CHECKPOINT_PART_BYTES=100000000000)
  steps=${STEPS:-160}
  [ $mode = async-trace ] && { steps=60; extra+=(--profile-steps 38:42 --profile-out $R/trace-async.json); }
  env "${env[@]}" timeout ${RUN_TIMEOUT:-150} build-gpu/ptrain train "${GPT[@]}" --max-steps $steps "${extra[@]}" --metrics-out $R/gpt-large-$mode.json > $R/gpt-large-$mode.log 2>&1
  echo "$mode rc $? at $(( $(date +%s) - t0 )) s"; tail -n 2 $R/gpt-large-$mode.log
  [ -d $CK ] && ls -la $CK > $R/files-$mode.txt
  python3 -c "
import json,sys; r=json.load(open(sys.argv[1])); x=r.get('extra',{}); b=x.get('checkpoint_blocking') or {}
print(' ', sys.argv[2], 'steady tok/s', r.get('steady_tokens_per_second'), 'tok/s', r.get('tokens_per_second'),
      'step median s', r.get('steady_step_median_seconds'), 'blocking s', r.get('checkpoint_blocking_seconds'),
      'saves', [round(s, 3) for s in b.get('saves', [])], 'waits', [round(s, 3) for s in b.get('waits', [])],
      'end wait', b.get('end_wait'), 'writes', [round(s, 2) for s in x.get('checkpoint_writes', [])],
      'staging', x.get('checkpoint_staging'), 'pinned', x.get('checkpoint_pinned_blocks'), 'train s', r.get('train_wall_seconds'), 'total s', r.get('total_wall_seconds'))
for p in x.get('checkpoint_write_phases', []): print('   phases', {k: round(v, 2) for k, v in p.items()})" $R/gpt-large-$mode.json $mode
done
rm -rf $CK
if [ "${KERNEL_TESTS:-1}" = 1 ]; then
  timeout 240 ./build-gpu/tests/kernels/test_kernels --gtest_filter='CheckpointStaging.*' > $R/kernel-tests.log 2>&1; echo "kernel tests rc $? at $(( $(date +%s) - t0 )) s"
  grep -E "^\[  (FAILED|PASSED) |tests ran|SKIPPED \]" $R/kernel-tests.log | head -n 30
fi
gzip -f $R/trace-async.json 2>/dev/null
tar -czf $OUT/call11.tgz -C $OUT r
