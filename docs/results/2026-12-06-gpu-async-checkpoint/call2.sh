#!/usr/bin/env bash
# The second device call (about 5 minutes): as call.sh, but 300 steps in one epoch (2,400 sequences) with a
# checkpoint every 100 steps (saves at steps 100, 200 and 300), a save interval longer than one write to this
# machine's disk takes; none, --async-checkpoint and synchronous. Carry .gpu-deps/ and .data/.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/r; mkdir -p $R
t0=$(date +%s)
BUILD_TARGETS="ptrain" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; echo "build rc $? at $(( $(date +%s) - t0 )) s"
grep -E "error" $R/build.txt | head -20
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
df -h /tmp | tail -1; nproc; free -g | head -2
# The disk the checkpoints go to: 4 GiB written and fsynced, as a checkpoint's write is.
GPT=(--model gpt-large --dataset synthetic-tokens --data-path 2400:1024:50257 --batch-size 8 --epochs 1 --max-steps 300
     --test-limit 16 --optimizer adamw --lr 3e-4 --warmup-steps 5 --schedule cosine --precision amp-bf16
     --progress lines --log-every 50)
for mode in none async sync; do
  extra=(); rm -rf /tmp/ck
  [ $mode != none ] && extra=(--checkpoint-dir /tmp/ck --checkpoint-every 100 --keep-checkpoints 1)
  [ $mode = async ] && extra+=(--async-checkpoint)
  timeout 160 build-gpu/ptrain train "${GPT[@]}" "${extra[@]}" --metrics-out $R/gpt-large-$mode.json > $R/gpt-large-$mode.log 2>&1
  echo "$mode rc $? at $(( $(date +%s) - t0 )) s"; grep -E "staged|async" $R/gpt-large-$mode.log | head -3; tail -n 2 $R/gpt-large-$mode.log
  python3 -c "
import json,sys; r=json.load(open(sys.argv[1])); x=r.get('extra',{})
print(' ', sys.argv[2], 'steady tok/s', r.get('steady_tokens_per_second'), 'step median s', r.get('steady_step_median_seconds'),
      'blocking s', r.get('checkpoint_blocking_seconds'), x.get('checkpoint_blocking'), 'write s', r.get('checkpoint_write_seconds'),
      'staging', x.get('checkpoint_staging'), 'train s', r.get('train_wall_seconds'), 'total s', r.get('total_wall_seconds'),
      'peak alloc GiB', (r.get('peak_allocated_bytes') or 0)/2**30, 'nvml GiB', (r.get('peak_nvml_used_bytes') or 0)/2**30,
      'host rss GiB', (r.get('host_peak_rss_bytes') or 0)/2**30)" $R/gpt-large-$mode.json $mode
  du -sh /tmp/ck 2>/dev/null
done
tar -czf $OUT/call.tgz -C $OUT r
