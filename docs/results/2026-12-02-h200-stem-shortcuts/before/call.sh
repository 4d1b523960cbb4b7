#!/usr/bin/env bash
# Call 1: ptrain's amp-bf16 ResNet-50 step traced; compiled PyTorch's traced; compiled PyTorch with CUDA graphs
# (reduce-overhead) beside ptrain, ResNet-50 and GPT-2 small amp-bf16.
set -u
export CUDACXX=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc) NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/r; mkdir -p $R
pack() { tar -czf $OUT/call1.tgz -C $OUT r; }
t0=$(date +%s)
BUILD_TARGETS="ptrain" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; tail -5 $R/build.txt
echo "build done $(( $(date +%s) - t0 )) s"; pack
R50="--batch-size 128 --beta1 0.9 --beta2 0.999 --data .data/cifar10 --dataset cifar10 --epochs 1 --image-size 224 --lr 0.05 --max-steps 30 --model resnet50 --momentum 0.9 --optimizer sgd --schedule cosine --seed 0 --test-limit 256 --train-limit 3840 --warmup-epochs 0.5 --weight-decay 5e-4 --channels-last --fused-optimizer --no-eval"
GPT="--batch-size 16 --data 480:1024:50257 --dataset synthetic-tokens --epochs 1 --lr 6e-4 --max-steps 30 --model gpt-small --optimizer adamw --schedule cosine --seed 0 --test-limit 32 --warmup-steps 5 --weight-decay 0.0005 --fused-optimizer --no-eval"
run() { local name=$1; shift; local s=$(date +%s); timeout ${TMO:-150} "$@" > $R/$name.log 2>&1; echo "$name rc=$? $(( $(date +%s) - s )) s: $(grep -hE 'steady|img/s|tok|rror' $R/$name.log | tail -n 2 | tr '\n' ' ' | cut -c1-300)"; pack; }
# ptrain, plain runs, then traced
run ptrain-r50 build-gpu/ptrain train --config .data/r50.yaml --precision amp-bf16 --progress lines --metrics-out $R/ptrain-r50.json --no-eval-each-epoch
run ptrain-gpt build-gpu/ptrain train --config .data/gpt.yaml --precision amp-bf16 --progress lines --metrics-out $R/ptrain-gpt.json --no-eval-each-epoch
PROFILE_STEPS=12:16 OUT=$R scripts/gpu_session.sh profile r50 --config .data/r50.yaml --precision amp-bf16 --no-eval-each-epoch > $R/profile-r50.txt 2>&1; echo "profile ptrain done $(( $(date +%s) - t0 )) s"; pack
# PyTorch compiled with CUDA graphs
TMO=200 run ro-r50 python3 bench/pytorch_reference.py --precision amp-bf16 $R50 --compile --compile-mode reduce-overhead --metrics-out $R/ro-r50.json --cache-dir .data/pc
TMO=200 run ro-gpt python3 bench/pytorch_reference.py --precision amp-bf16 $GPT --compile --compile-mode reduce-overhead --metrics-out $R/ro-gpt.json --cache-dir .data/pc
# compiled (default mode) traced, kernel families as ptrain's
TMO=150 run prof-compiled python3 scripts/profile_pytorch_reference.py --trace-out $R/trace-compiled.json bench/pytorch_reference.py --precision amp-bf16 $R50 --compile --max-steps 20 --cache-dir .data/pc
python3 scripts/trace_summary.py $R/trace-compiled.json --steps 5 --top 40 > $R/summary-compiled.txt 2>&1; xz -T4 $R/trace-compiled.json
echo "all done $(( $(date +%s) - t0 )) s"; pack
