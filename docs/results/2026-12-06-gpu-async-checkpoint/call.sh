#!/usr/bin/env bash
# One device call (about 8 minutes): what saving costs GPT-2 large amp-bf16 (batch 8 x 1,024 tokens, AdamW: 3.1 GB of
# fp32 weights and 6.2 GB of moments a checkpoint) at a checkpoint every 20 steps, --async-checkpoint against
# synchronous saving, beside the same run without checkpoints; the checkpoints go to the machine's disk (/tmp), whose
# write speed is measured first. Before them, the device-snapshot staging's GPU test. Carry .gpu-deps/ and .data/
# (scripts/gpu_session.sh build unpacks them).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/r; mkdir -p $R
t0=$(date +%s)
BUILD_TARGETS="ptrain test_kernels" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; echo "build rc $? at $(( $(date +%s) - t0 )) s"
grep -E "error" $R/build.txt | head -20
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
timeout 60 ./build-gpu/tests/kernels/test_kernels --gtest_filter='CheckpointStaging.*' > $R/tests.txt 2>&1
echo "tests rc $? at $(( $(date +%s) - t0 )) s"; grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|rror" $R/tests.txt | head -20
df -h /tmp | tail -1; nproc; free -g | head -2
# The disk the checkpoints go to: 4 GiB written and fsynced, as a checkpoint's write is.
dd if=/dev/zero of=/tmp/dd.bin bs=64M count=64 conv=fsync 2>&1 | tail -1; rm -f /tmp/dd.bin
GPT=(--model gpt-large --dataset synthetic-tokens --data-path 240:1024:50257 --batch-size 8 --epochs 1 --max-steps 80
     --test-limit 16 --optimizer adamw --lr 3e-4 --warmup-steps 5 --schedule cosine --precision amp-bf16
     --progress lines --log-every 20)
for mode in none async sync; do
  extra=(); rm -rf /tmp/ck
  [ $mode != none ] && extra=(--checkpoint-dir /tmp/ck --checkpoint-every 20 --keep-checkpoints 1)
  [ $mode = async ] && extra+=(--async-checkpoint)
  timeout 170 build-gpu/ptrain train "${GPT[@]}" "${extra[@]}" --metrics-out $R/gpt-large-$mode.json > $R/gpt-large-$mode.log 2>&1
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
