#!/usr/bin/env bash
# Builds batch_norm_bench variants in parallel, each from a copy of batch_norm.cu with constants replaced:
#   NAME "SED-EXPRESSION"...
CUDACXX=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
mkdir -p build-var
while [ $# -gt 0 ]; do
  name=$1 expr=$2; shift 2
  mkdir -p build-var/$name/ptrain/kernels/cuda
  cp src/ptrain/kernels/cuda/*.h src/ptrain/kernels/cuda/*.cuh build-var/$name/ptrain/kernels/cuda/
  sed -e "$expr" src/ptrain/kernels/cuda/batch_norm.cu > build-var/$name/batch_norm.cu
  $CUDACXX -std=c++17 -O3 --use_fast_math -arch=sm_90 -Ibuild-var/$name bench/kernels/batch_norm_bench.cu build-var/$name/batch_norm.cu -o build-var/bnb-$name > build-var/$name.log 2>&1 &
done
wait
ls build-var
