#!/usr/bin/env bash
# A seventh device call (about 4 minutes with its build): why call 6's background writes took 3.2 s of file writes
# during training against 1.1 s once training had ended (and the probe's 1.0 s). GPT-2 large, --async-checkpoint
# every 20 steps into /dev/shm, STEPS (default 160) steps, run as:
#   async          as call 6, with a snapshot of its threads' CPU use (top -H) 25 s in
#   async-passive  OMP_WAIT_POLICY=PASSIVE: LibTorch's idle OpenMP threads sleep instead of spinning
# Carry .gpu-deps/ and .data/ when it builds.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/r; mkdir -p $R
t0=$(date +%s)
if [ ! -x build-gpu/ptrain ]; then
  BUILD_TARGETS=ptrain OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; echo "build rc $? at $(( $(date +%s) - t0 )) s"
fi
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
GPT=(--model gpt-large --dataset synthetic-tokens --data-path 2400:1024:50257 --batch-size 8 --epochs 1 --max-steps ${STEPS:-160}
     --test-limit 16 --optimizer adamw --lr 3e-4 --warmup-steps 5 --schedule cosine --precision amp-bf16
     --progress lines --log-every 20 --checkpoint-dir /dev/shm/ptrain-ck --checkpoint-every 20 --keep-checkpoints 1
     --async-checkpoint)
for mode in ${MODES:-async async-passive}; do
  rm -rf /dev/shm/ptrain-ck; env=()
  [ $mode = async-passive ] && env=(OMP_WAIT_POLICY=PASSIVE)
  env "${env[@]}" timeout ${RUN_TIMEOUT:-120} build-gpu/ptrain train "${GPT[@]}" --metrics-out $R/gpt-large-$mode.json > $R/gpt-large-$mode.log 2>&1 &
  pid=$!
  if [ $mode = async ]; then sleep 25; top -H -b -n 1 -d 1 -p $(pgrep -x ptrain | head -n 1) | head -n 40 > $R/top-$mode.txt; fi
  wait $pid; echo "$mode rc $? at $(( $(date +%s) - t0 )) s"
  [ -f $R/top-$mode.txt ] && head -n 30 $R/top-$mode.txt
  python3 -c "
import json,sys; r=json.load(open(sys.argv[1])); x=r.get('extra',{}); b=x.get('checkpoint_blocking') or {}
print(' ', sys.argv[2], 'steady tok/s', r.get('steady_tokens_per_second'), 'waits', [round(s, 3) for s in b.get('waits', [])],
      'writes', [round(s, 2) for s in x.get('checkpoint_writes', [])])
for p in x.get('checkpoint_write_phases', []): print('   phases', {k: round(v, 2) for k, v in p.items()})" $R/gpt-large-$mode.json $mode
done
rm -rf /dev/shm/ptrain-ck
tar -czf $OUT/call7.tgz -C $OUT r
