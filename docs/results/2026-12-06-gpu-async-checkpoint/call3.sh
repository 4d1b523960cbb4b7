#!/usr/bin/env bash
# A third device call (about 4 minutes; chained after a call that built build-gpu/ptrain, else it builds): what
# --async-checkpoint costs at a checkpoint every 20 steps where the write is not held up by this machine's disk
# (1.4 GB/s with fsync, call.sh): GPT-2 large amp-bf16, 300 steps, the checkpoints in /dev/shm (memory; fsync
# returns at once there). Three runs: none, synchronous and --async-checkpoint, each a save every 20 steps (15 saves
# of 9.4 GB) keeping one. Carry .gpu-deps/ and .data/ when it builds.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/r; mkdir -p $R
t0=$(date +%s)
if [ ! -x build-gpu/ptrain ]; then
  BUILD_TARGETS="ptrain" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; echo "build rc $? at $(( $(date +%s) - t0 )) s"
fi
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
df -h /dev/shm | tee $R/shm.txt; free -g | tee -a $R/shm.txt
avail=$(df --output=avail -B1G /dev/shm | tail -1)
[ "${avail:-0}" -ge 30 ] || { echo "/dev/shm has ${avail} GiB, under the 30 GiB two checkpoints and a write need"; exit 3; }
GPT=(--model gpt-large --dataset synthetic-tokens --data-path 2400:1024:50257 --batch-size 8 --epochs 1 --max-steps ${STEPS:-300}
     --test-limit 16 --optimizer adamw --lr 3e-4 --warmup-steps 5 --schedule cosine --precision amp-bf16
     --progress lines --log-every 20)
CK=/dev/shm/ptrain-ck
for mode in none sync async; do
  extra=(); rm -rf $CK
  [ $mode != none ] && extra=(--checkpoint-dir $CK --checkpoint-every 20 --keep-checkpoints 1)
  [ $mode = async ] && extra+=(--async-checkpoint)
  timeout ${RUN_TIMEOUT:-150} build-gpu/ptrain train "${GPT[@]}" "${extra[@]}" --metrics-out $R/gpt-large-$mode.json > $R/gpt-large-$mode.log 2>&1
  echo "$mode rc $? at $(( $(date +%s) - t0 )) s"; tail -n 2 $R/gpt-large-$mode.log
  python3 -c "
import json,sys; r=json.load(open(sys.argv[1])); x=r.get('extra',{}); b=x.get('checkpoint_blocking') or {}
print(' ', sys.argv[2], 'steady tok/s', r.get('steady_tokens_per_second'), 'tok/s', r.get('tokens_per_second'),
      'step median s', r.get('steady_step_median_seconds'), 'blocking s', r.get('checkpoint_blocking_seconds'),
      'saves', [round(s, 3) for s in b.get('saves', [])], 'end wait', b.get('end_wait'),
      'write s', r.get('checkpoint_write_seconds'), 'staging', x.get('checkpoint_staging'),
      'train s', r.get('train_wall_seconds'), 'total s', r.get('total_wall_seconds'))" $R/gpt-large-$mode.json $mode
done
rm -rf $CK
tar -czf $OUT/call3.tgz -C $OUT r
