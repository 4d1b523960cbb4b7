#!/usr/bin/env bash
# The capture's emptied cache: device memory (allocator and NVML) and speed of captured steps.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/r; mkdir -p $R
pack() { tar -czf $OUT/call.tgz -C $OUT r; }
t0=$(date +%s)
BUILD_TARGETS="ptrain" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; tail -2 $R/build.txt
echo "build done $(( $(date +%s) - t0 )) s"; pack
show() { python3 -c "import json,sys;r=json.load(open(sys.argv[1]));g=2**30;print(' steady', round(r.get('steady_images_per_second') or 0), 'alloc %.2f reserved %.2f nvml %.2f GiB' % ((r.get('peak_allocated_bytes') or 0)/g, (r.get('peak_reserved_bytes') or 0)/g, (r.get('peak_nvml_used_bytes') or 0)/g), 'graphs:', r.get('cuda_graphs_note') or 'captured')" $1 2>&1 | cut -c1-300; }
R50="--config configs/cifar10-resnet50-224.yaml --epochs 1 --train-limit 6400 --test-limit 256 --no-eval-each-epoch --progress none --loader-threads 16"
run() { local name=$1; shift; local st=$(date +%s); timeout 150 "$@" --metrics-out $R/$name.json > $R/$name.log 2>&1; echo "$name rc=$? $(( $(date +%s) - st )) s"; show $R/$name.json; pack; }
run r50-amp-bf16 build-gpu/ptrain train $R50 --precision amp-bf16 --max-steps 40
run r50-amp-bf16-ddp build-gpu/ptrain launch --nproc-per-node 1 -- build-gpu/ptrain train $R50 --precision amp-bf16 --max-steps 40 --strategy ddp
run r50-tf32 build-gpu/ptrain train $R50 --precision tf32 --max-steps 30
run r50-fp32 build-gpu/ptrain train $R50 --precision fp32 --max-steps 20
GPT="--model gpt-small --dataset synthetic-tokens --data-path 480:1024:50257 --batch-size 16 --epochs 1 --max-steps 30 --test-limit 32 --optimizer adamw --lr 6e-4 --warmup-steps 5 --schedule cosine --no-eval-each-epoch --progress none"
run gpt-amp-bf16 build-gpu/ptrain train $GPT --precision amp-bf16
run gpt-amp-bf16-nographs build-gpu/ptrain train $GPT --precision amp-bf16 --no-cuda-graphs
echo "all done $(( $(date +%s) - t0 )) s"; pack
