#!/usr/bin/env bash
# Verify the kernels of the last commits on LibTorch 2.x, and the strategies' world-size-1 baseline with traces.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/r; mkdir -p $R
pack() { tar -czf $OUT/call.tgz -C $OUT r; }
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $R/gpu.txt
BUILD_TARGETS="ptrain test_kernels" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; tail -3 $R/build.txt
echo "build done $(( $(date +%s) - t0 )) s"; pack
OUT=$R timeout 240 scripts/gpu_session.sh kernel-tests > $R/kt.txt 2>&1; grep -cE "OK \]" $R/kt.txt; grep -E "FAILED|PASSED|tests ran" $R/kernel-tests.log | tail -4
echo "tests done $(( $(date +%s) - t0 )) s"; pack
R50="--config configs/cifar10-resnet50-224.yaml --precision amp-bf16 --epochs 1 --max-steps 40 --train-limit 6400 --test-limit 256 --no-eval-each-epoch --progress none"
for s in single ddp zero2 fsdp; do
  st=$(date +%s)
  timeout 120 build-gpu/ptrain launch --nproc-per-node 1 -- build-gpu/ptrain train $R50 --strategy $s --metrics-out $R/r50-$s.json > $R/r50-$s.log 2>&1
  echo "$s rc=$? $(( $(date +%s) - st )) s"
  python3 -c "import json,sys;r=json.load(open(sys.argv[1]));print(' steady', round(r.get('steady_images_per_second') or 0), 'alloc GiB %.2f' % ((r.get('peak_allocated_bytes') or 0)/2**30), 'reserved GiB %.2f' % ((r.get('peak_reserved_bytes') or 0)/2**30), 'nvml', r.get('peak_device_memory_bytes') or r.get('nvml_peak_memory_bytes'), 'note', r.get('cuda_graphs_note'), 'phases', r.get('step_phase_seconds'))" $R/r50-$s.json 2>&1 | cut -c1-400
  pack
done
for s in ddp zero2; do
  timeout 120 build-gpu/ptrain launch --nproc-per-node 1 -- build-gpu/ptrain train $R50 --strategy $s --profile-out $R/trace-$s.json --profile-steps 21:23 > $R/prof-$s.log 2>&1
  python3 scripts/trace_summary.py $R/trace-$s.json --steps 3 --top 25 > $R/summary-$s.txt 2>&1; head -n 25 $R/summary-$s.txt
  xz -T8 -6 $R/trace-$s.json; pack
done
echo "all done $(( $(date +%s) - t0 )) s"; pack
