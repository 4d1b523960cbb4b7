#!/usr/bin/env bash
# The second device call (about 5 minutes), made just before the quick suite's call (2026-12-06-h100-quick-suite/call.sh)
# on the same machine:
# 1. builds ptrain;
# 2. the quick suite's check at 300 steps: ptrain fp16, amp-bf16 and ddp amp-bf16, and PyTorch eager amp-bf16,
#    each at 300 steps (configs/bench/quick.yaml with max-steps=300), for compare.py against the quick suite's 60;
# 3. GPT-2 large amp-bf16 over 300 steps in one epoch (2,400 sequences) without checkpoints and with a checkpoint every
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
[ -d .data/cifar10/train ] || { mkdir -p .data/cifar10 && tar -xJf .data/cifar10-jpg.tar.xz -C .data/cifar10; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
export CUDA_CACHE_PATH=$PWD/.bench/nv-cache-300; rm -rf .bench/quick-300
skip=()
for run in fp32-single-x1 fp16-master-single-x1 amp-fp16-single-x1 fp32-dp-x1 amp-bf16-dp-x1 fp32-ddp-x1 fp32-zero1-x1 \
           amp-bf16-zero1-x1 fp32-zero2-x1 amp-bf16-zero2-x1 fp32-zero3-x1 amp-bf16-zero3-x1 fp32-fsdp-x1 amp-bf16-fsdp-x1 \
           pytorch/fp16-single-x1 pytorch/amp-bf16-ddp-x1; do
  skip+=(--skip "$run")
done
timeout 230 build-gpu/ptrain bench --suite quick --pytorch --out .bench/quick-300 --run-timeout 80 --time-limit 200 \
  --set max-steps=300 --set train-limit=38400 "${skip[@]}" > $R/bench-300.log 2>&1
echo "bench-300 rc $? at $(( $(date +%s) - t0 )) s"
grep -E "^ptrain bench: expected|^warm-up|FAILED|done:" $R/bench-300.log | cut -c1-200
tar -czf $OUT/quick-300.tgz -C .bench quick-300
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
