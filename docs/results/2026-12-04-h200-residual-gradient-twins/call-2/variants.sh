#!/usr/bin/env bash
# Builds batch_norm_bench variants, each from a copy of a batch_norm.cu with an edit applied, into .data/var
# (carried to the GPU machine; variants.txt says which ran):   NAME SOURCE "SED-EXPRESSION"...
mkdir -p .data/var
while [ $# -gt 0 ]; do
  name=$1 src=$2 expr=$3; shift 3
  d=build-var/$name; mkdir -p $d/ptrain/kernels/cuda
  cp src/ptrain/kernels/cuda/*.h src/ptrain/kernels/cuda/*.cuh $d/ptrain/kernels/cuda/
  sed -e "$expr" $src > $d/batch_norm.cu
  nvcc -std=c++17 -O3 --use_fast_math -arch=sm_90 -I$d bench/kernels/batch_norm_bench.cu $d/batch_norm.cu \
    -o .data/var/bnb-$name > $d/log 2>&1 || echo "FAILED $name"
done
ls -la .data/var
