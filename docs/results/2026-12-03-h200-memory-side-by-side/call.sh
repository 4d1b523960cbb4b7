#!/usr/bin/env bash
# Both frameworks' device memory side by side (ResNet-50 amp-bf16, tf32, fp32; GPT-2 small amp-bf16), a run with
# --tensorboard checked by TensorBoard's own EventAccumulator, and a --profile-out trace with step markers.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/r; mkdir -p $R
pack() { tar -czf $OUT/call.tgz -C $OUT r; }
t0=$(date +%s)
BUILD_TARGETS="ptrain" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; tail -2 $R/build.txt
echo "build done $(( $(date +%s) - t0 )) s"; pack
show() { python3 -c "import json,sys;r=json.load(open(sys.argv[1]));g=2**30;print(' steady', round(r.get('steady_images_per_second') or 0), 'alloc %.2f reserved %.2f nvml %.2f GiB' % ((r.get('peak_allocated_bytes') or 0)/g, (r.get('peak_reserved_bytes') or 0)/g, (r.get('peak_nvml_used_bytes') or 0)/g), 'graphs:', r.get('cuda_graphs_note') or r.get('compile') or '')" $1 2>&1 | cut -c1-300; }
run() { local name=$1; shift; local st=$(date +%s); timeout 200 "$@" --metrics-out $R/$name.json > $R/$name.log 2>&1; echo "$name rc=$? $(( $(date +%s) - st )) s"; show $R/$name.json; pack; }
R50="--config configs/cifar10-resnet50-224.yaml --epochs 1 --train-limit 6400 --test-limit 256 --no-eval-each-epoch --progress none --loader-threads 16 --warmup-epochs 0"
run r50-amp-bf16 build-gpu/ptrain train $R50 --precision amp-bf16 --max-steps 40 --tensorboard $R/tb --log-jsonl $R/r50.jsonl --log-every 5
run r50-tf32 build-gpu/ptrain train $R50 --precision tf32 --max-steps 30
run r50-fp32 build-gpu/ptrain train $R50 --precision fp32 --max-steps 20
run r50-amp-bf16-profiled build-gpu/ptrain train $R50 --precision amp-bf16 --max-steps 24 --no-cuda-graphs --profile-out $R/r50-trace.json --profile-steps 20:22
PT="python3 bench/pytorch_reference.py --data .data/cifar10 --dataset cifar10 --model resnet50 --image-size 224 --batch-size 128 --epochs 1 --train-limit 6400 --test-limit 256 --no-eval --channels-last --fused-optimizer --warmup-epochs 0"
run pt-eager-amp-bf16 $PT --precision amp-bf16 --max-steps 40
run pt-eager-tf32 $PT --precision tf32 --max-steps 30
run pt-eager-fp32 $PT --precision fp32 --max-steps 20
run pt-compiled-ro-amp-bf16 $PT --precision amp-bf16 --max-steps 40 --compile --compile-mode reduce-overhead
run pt-compiled-amp-bf16 $PT --precision amp-bf16 --max-steps 40 --compile
python3 tests/metrics/tensorboard_check.py $R/tb train/loss=8 memory/peak_reserved_gib=8 memory/peak_device_gib=8 > $R/tensorboard-check.txt 2>&1; echo "tensorboard check rc=$?"; tail -5 $R/tensorboard-check.txt
python3 scripts/trace_summary.py $R/r50-trace.json --steps 3 > $R/trace-summary.txt 2>&1; head -30 $R/trace-summary.txt
grep -o '"ProfilerStep#[0-9]*"' $R/r50-trace.json | sort -u | head; grep -c 'Optimizer' $R/r50-trace.json
echo "all done $(( $(date +%s) - t0 )) s"; pack
