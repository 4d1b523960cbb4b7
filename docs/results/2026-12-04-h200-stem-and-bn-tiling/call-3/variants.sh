#!/usr/bin/env bash
# Builds batch_norm_bench variants (macros of batch_norm.cu) in parallel: NAME "DEFINES"...
CUDACXX=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
mkdir -p build-var
while [ $# -gt 0 ]; do
  name=$1 defs=$2; shift 2
  $CUDACXX -std=c++17 -O3 --use_fast_math -arch=sm_90 -Isrc $defs bench/kernels/batch_norm_bench.cu src/ptrain/kernels/cuda/batch_norm.cu -o build-var/bnb-$name > build-var/$name.log 2>&1 &
done
wait
ls build-var
