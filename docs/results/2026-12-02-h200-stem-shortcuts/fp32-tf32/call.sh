#!/usr/bin/env bash
# Call 6: ResNet-50 in fp32 (TF32 off) and tf32, ptrain beside PyTorch eager, for the memory and the ratio.
set -u
export CUDACXX=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc) NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/r; mkdir -p $R
pack() { tar -czf $OUT/call.tgz -C $OUT r; }
t0=$(date +%s)
BUILD_TARGETS="ptrain" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; tail -1 $R/build.txt
echo "build done $(( $(date +%s) - t0 )) s"; pack
run() { local name=$1; shift; local s=$(date +%s); timeout ${TMO:-100} "$@" > $R/$name.log 2>&1; echo "$name rc=$? $(( $(date +%s) - s )) s: $(grep -hE 'steady|img/s|rror' $R/$name.log | tail -n 1 | cut -c1-200)"; pack; }
R50="--batch-size 128 --data .data/cifar10 --dataset cifar10 --epochs 1 --image-size 224 --lr 0.05 --max-steps 30 --model resnet50 --momentum 0.9 --optimizer sgd --schedule cosine --seed 0 --test-limit 256 --train-limit 3840 --warmup-epochs 0.5 --weight-decay 5e-4 --channels-last --no-eval"
for p in fp32 tf32; do
  run ptrain-r50-$p build-gpu/ptrain train --config .data/r50.yaml --precision $p --progress lines --metrics-out $R/ptrain-r50-$p.json --no-eval-each-epoch
  run eager-r50-$p python3 bench/pytorch_reference.py --precision $p $R50 --metrics-out $R/eager-r50-$p.json --cache-dir .data/pc
done
echo "all done $(( $(date +%s) - t0 )) s"; pack
