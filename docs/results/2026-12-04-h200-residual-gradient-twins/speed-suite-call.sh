#!/usr/bin/env bash
# The report issue 25 ends with: the speed suite (configs/bench/speed.yaml: ResNet-50 in every mode and its batch
# sweep, GPT-2 small, each beside PyTorch eager and compiled with CUDA graphs; allocated, reserved and NVML for
# both frameworks), about 18-32 minutes of runs in all. One call runs what fits in 540 s and packs .bench/speed into
# $OUT/bench-speed.tgz; for the next call, unpack that into .bench/ here and carry .bench with .gpu-deps and .data:
# the same command continues where the last stopped (the suite's header says the order of its runs).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
[ -d .data/cifar10/train ] || { mkdir -p .data/cifar10 && tar -xJf .data/cifar10-jpg.tar.xz -C .data/cifar10; }
t0=$(date +%s)
BUILD_TARGETS="ptrain" OUT=$OUT scripts/gpu_session.sh build > $OUT/build.txt 2>&1; echo "build rc $? $(( $(date +%s) - t0 )) s"
OUT=$OUT scripts/gpu_session.sh bench speed --suite speed --pytorch --no-estimate \
  --time-limit $(( 560 - ($(date +%s) - t0) )) --run-timeout 300 > $OUT/bench.txt 2>&1
echo "bench rc $? $(( $(date +%s) - t0 )) s"; tail -n 20 $OUT/bench.txt
