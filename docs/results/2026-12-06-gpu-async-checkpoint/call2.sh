#!/usr/bin/env bash
# The second device call (about 3 minutes), made just before the quick suite's call (2026-12-06-h100-quick-suite/call.sh)
# on the same machine, which uses its build:
# 1. builds ptrain;
# 2. GPT-2 large amp-bf16 over 300 steps in one epoch (2,400 sequences) without checkpoints and with a checkpoint every
#    100 steps under --async-checkpoint (saves at steps 100, 200 and 300): a save interval longer than one write to
#    this machine's disk takes (call.sh measured the disk and the synchronous saves).
# Carry .gpu-deps/ and .data/.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/r; mkdir -p $R
t0=$(date +%s)
BUILD_TARGETS="ptrain" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; echo "build rc $? at $(( $(date +%s) - t0 )) s"
grep -E "error" $R/build.txt | head -20
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
GPT=(--model gpt-large --dataset synthetic-tokens --data-path 2400:1024:50257 --batch-size 8 --epochs 1 --max-steps 300
     --test-limit 16 --optimizer adamw --lr 3e-4 --warmup-steps 5 --schedule cosine --precision amp-bf16
     --progress lines --log-every 50)
for mode in none async; do
  extra=(); rm -rf /tmp/ck
  [ $mode = async ] && extra=(--checkpoint-dir /tmp/ck --checkpoint-every 100 --keep-checkpoints 1 --async-checkpoint)
  timeout 100 build-gpu/ptrain train "${GPT[@]}" "${extra[@]}" --metrics-out $R/gpt-large-$mode.json > $R/gpt-large-$mode.log 2>&1
  echo "$mode rc $? at $(( $(date +%s) - t0 )) s"; tail -n 2 $R/gpt-large-$mode.log
  python3 -c "
import json,sys; r=json.load(open(sys.argv[1])); x=r.get('extra',{})
print(' ', sys.argv[2], 'steady tok/s', r.get('steady_tokens_per_second'), 'step median s', r.get('steady_step_median_seconds'),
      'blocking s', r.get('checkpoint_blocking_seconds'), x.get('checkpoint_blocking'), 'write s', r.get('checkpoint_write_seconds'),
      'staging', x.get('checkpoint_staging'), 'train s', r.get('train_wall_seconds'), 'total s', r.get('total_wall_seconds'),
      'nvml GiB', (r.get('peak_nvml_used_bytes') or 0)/2**30, 'host rss GiB', (r.get('host_peak_rss_bytes') or 0)/2**30)" $R/gpt-large-$mode.json $mode
done
rm -rf /tmp/ck
tar -czf $OUT/call2.tgz -C $OUT r
