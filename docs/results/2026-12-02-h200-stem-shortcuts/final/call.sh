#!/usr/bin/env bash
# Call 5 (the committed kernels): parity tests; ResNet-50 in the half modes; amp-bf16 beside PyTorch eager,
# compiled and compiled with CUDA graphs; amp-fp16 beside compiled with CUDA graphs; the 5-epoch workload in
# amp-bf16 and fp16 with master weights; a trace of the amp-bf16 step.
set -u
export CUDACXX=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc) NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/r; mkdir -p $R
pack() { tar -czf $OUT/call.tgz -C $OUT r; }
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $R/gpu.txt
python3 -c "import torch;print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version())" >> $R/gpu.txt
BUILD_TARGETS="ptrain test_kernels" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; tail -2 $R/build.txt
echo "build done $(( $(date +%s) - t0 )) s"; pack
OUT=$R scripts/gpu_session.sh kernel-tests > $R/kt.txt 2>&1; grep -E "PASSED|FAILED|tests ran" $R/kt.txt | head
grep -A2 "Failure" $R/kernel-tests.log | head -12
echo "tests done $(( $(date +%s) - t0 )) s"; pack
run() { local name=$1; shift; local s=$(date +%s); timeout ${TMO:-150} "$@" > $R/$name.log 2>&1; echo "$name rc=$? $(( $(date +%s) - s )) s: $(grep -hE 'steady|img/s|tok|rror' $R/$name.log | tail -n 1 | cut -c1-200)"; pack; }
for p in amp-bf16 amp-fp16; do
  run ptrain-r50-$p build-gpu/ptrain train --config .data/r50.yaml --precision $p --progress lines --metrics-out $R/ptrain-r50-$p.json --no-eval-each-epoch
done
R50="--batch-size 128 --data .data/cifar10 --dataset cifar10 --epochs 1 --image-size 224 --lr 0.05 --max-steps 30 --model resnet50 --momentum 0.9 --optimizer sgd --schedule cosine --seed 0 --test-limit 256 --train-limit 3840 --warmup-epochs 0.5 --weight-decay 5e-4 --channels-last --no-eval"
run eager-r50-amp-bf16 python3 bench/pytorch_reference.py --precision amp-bf16 $R50 --metrics-out $R/eager-r50-amp-bf16.json --cache-dir .data/pc
TMO=120 run compiled-r50-amp-bf16 python3 bench/pytorch_reference.py --precision amp-bf16 $R50 --compile --fused-optimizer --metrics-out $R/compiled-r50-amp-bf16.json --cache-dir .data/pc
TMO=120 run ro-r50-amp-bf16 python3 bench/pytorch_reference.py --precision amp-bf16 $R50 --compile --compile-mode reduce-overhead --fused-optimizer --metrics-out $R/ro-r50-amp-bf16.json --cache-dir .data/pc
TMO=100 run ro-r50-amp-fp16 python3 bench/pytorch_reference.py --precision amp-fp16 $R50 --compile --compile-mode reduce-overhead --fused-optimizer --metrics-out $R/ro-r50-amp-fp16.json --cache-dir .data/pc
echo "pytorch done $(( $(date +%s) - t0 )) s"
OUT=$R timeout 170 scripts/gpu_session.sh reference amp-bf16 fp16+master > $R/reference.txt 2>&1; grep -E "result" $R/reference.txt | head -n 6
echo "5 epochs done $(( $(date +%s) - t0 )) s"; pack
for p in bf16 fp16; do
  run ptrain-r50-$p build-gpu/ptrain train --config .data/r50.yaml --precision $p --progress lines --metrics-out $R/ptrain-r50-$p.json --no-eval-each-epoch
done
PROFILE_STEPS=12:16 OUT=$R timeout 60 scripts/gpu_session.sh profile r50 --config .data/r50.yaml --precision amp-bf16 --no-eval-each-epoch > $R/profile-r50.txt 2>&1
echo "all done $(( $(date +%s) - t0 )) s"; pack
