#!/usr/bin/env bash
# One device call (about 5 minutes): what saving costs GPT-2 large amp-bf16 (batch 8 x 1,024 tokens, AdamW: 3.4 GB of
# fp32 weights and 6.7 GB of moments a checkpoint) at a checkpoint every 20 steps, synchronous against
# --async-checkpoint, beside the same run without checkpoints; the checkpoints go to the machine's disk (/tmp).
# Carry .gpu-deps/ and .data/ (scripts/gpu_session.sh build unpacks them).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/r; mkdir -p $R
t0=$(date +%s)
BUILD_TARGETS="ptrain" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; echo "build rc $? at $(( $(date +%s) - t0 )) s"
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
df -h /tmp | tail -1
GPT=(--model gpt-large --dataset synthetic-tokens --data-path 240:1024:50257 --batch-size 8 --epochs 1 --max-steps 60
     --test-limit 16 --optimizer adamw --lr 3e-4 --warmup-steps 5 --schedule cosine --precision amp-bf16
     --progress lines --log-every 20)
for mode in none sync async; do
  extra=(); rm -rf /tmp/ck
  [ $mode != none ] && extra=(--checkpoint-dir /tmp/ck --checkpoint-every 20 --keep-checkpoints 1)
  [ $mode = async ] && extra+=(--async-checkpoint)
  timeout 150 build-gpu/ptrain train "${GPT[@]}" "${extra[@]}" --metrics-out $R/gpt-large-$mode.json > $R/gpt-large-$mode.log 2>&1
  echo "$mode rc $? at $(( $(date +%s) - t0 )) s"; tail -n 2 $R/gpt-large-$mode.log
  python3 -c "
import json,sys; r=json.load(open(sys.argv[1]))
print(' ', sys.argv[2], 'steady tok/s', r.get('steady_tokens_per_second'), 'from step', r.get('steady_from_step'),
      'blocking s', r.get('checkpoint_blocking_seconds'), 'write s', r.get('checkpoint_write_seconds'),
      'wall', r.get('wall_seconds'), 'peak alloc', r.get('peak_allocated_bytes'), 'host rss', r.get('host_peak_rss_bytes'))" $R/gpt-large-$mode.json $mode
  du -sh /tmp/ck 2>/dev/null
done
tar -czf $OUT/call.tgz -C $OUT r
