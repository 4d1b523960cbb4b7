#!/usr/bin/env bash
# The graph released before the final evaluation, NVML every 10 ms: CapturedStep GPU tests, ResNet-50 device memory
# of ptrain (amp-bf16, tf32) beside PyTorch eager and compiled (amp-bf16).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/r; mkdir -p $R
pack() { tar -czf $OUT/call.tgz -C $OUT r; }
t0=$(date +%s)
mkdir -p .data/cifar10 && tar -xJf .data/cifar10-jpg.tar.xz -C .data/cifar10 &
BUILD_TARGETS="ptrain test_kernels" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; tail -2 $R/build.txt
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
echo "build done $(( $(date +%s) - t0 )) s"; pack; wait
timeout 150 build-gpu/tests/kernels/test_kernels --gtest_filter="CapturedStep.*" > $R/ktest.log 2>&1; echo "ktest rc=$?"
grep -E "^\[  (FAILED|PASSED|SKIPPED|  OK) |Failure|Expected|Which is" $R/ktest.log | head -20; pack
show() { python3 -c "import json,sys;r=json.load(open(sys.argv[1]));g=2**30;print(' steady', round(r.get('steady_images_per_second') or 0), 'alloc %.2f reserved %.2f nvml %.2f GiB' % ((r.get('peak_allocated_bytes') or 0)/g, (r.get('peak_reserved_bytes') or 0)/g, (r.get('peak_nvml_used_bytes') or 0)/g), 'test acc', r.get('final_test_accuracy'), 'graphs:', r.get('cuda_graphs'), r.get('cuda_graphs_note') or r.get('compile') or '')" $1 2>&1 | cut -c1-300; }
run() { local name=$1; shift; local st=$(date +%s); timeout 200 "$@" --metrics-out $R/$name.json > $R/$name.log 2>&1; echo "$name rc=$? $(( $(date +%s) - st )) s"; show $R/$name.json; pack; }
R50="--config configs/cifar10-resnet50-224.yaml --epochs 1 --train-limit 6400 --test-limit 2560 --no-eval-each-epoch --progress none --loader-threads 16 --warmup-epochs 0"
run r50-amp-bf16 build-gpu/ptrain train $R50 --precision amp-bf16 --max-steps 40 --log-jsonl $R/r50.jsonl --log-every 5
run r50-tf32 build-gpu/ptrain train $R50 --precision tf32 --max-steps 30
PT="python3 bench/pytorch_reference.py --data .data/cifar10 --dataset cifar10 --model resnet50 --image-size 224 --batch-size 128 --epochs 1 --train-limit 6400 --test-limit 256 --no-eval --channels-last --fused-optimizer --warmup-epochs 0"
run pt-eager-amp-bf16 $PT --precision amp-bf16 --max-steps 40
run pt-compiled-amp-bf16 $PT --precision amp-bf16 --max-steps 40 --compile
run pt-eager-tf32 $PT --precision tf32 --max-steps 30
echo "all done $(( $(date +%s) - t0 )) s"; pack
