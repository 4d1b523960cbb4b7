#!/usr/bin/env bash
# Builds call4.sh's binaries on the CPU machine (CUDA 13 toolkit, no GPU needed) into .gpu-bin/: bn_fin from
# b34a504's kernels and bn_<variant> from each patch in raw.tar.xz (patches/<variant>-from-b34a504.patch or
# -from-73a09be.patch, with patches/launch-h-from-b34a504.patch for the field they read), about 7 minutes. Run
# from the repository's root:
#   bash docs/results/2026-12-07-h100-batch-norm-forward/prepare_call4.sh
# then apply patches/tree-from-73a09be.patch and patches/launch-h-from-b34a504.patch to src/ (git apply; the tree
# call5.sh tests) and run calls 4 and 5 in one device call (call5.sh's header), carrying .gpu-bin, .gpu-deps, .data.
set -euo pipefail
here=docs/results/2026-12-07-h100-batch-norm-forward
work=${WORK:-/tmp/prepare_call4}
rm -rf "$work" && mkdir -p "$work" .gpu-bin
tar -xJf $here/raw.tar.xz -C "$work" patches
flags="-std=c++17 -O3 --use_fast_math -lineinfo -arch=sm_90"
nvcc $flags -Isrc -c src/ptrain/kernels/cuda/max_pool.cu -o "$work/max_pool.o"
nvcc -std=c++17 -O3 -arch=sm_90 -Isrc -c bench/kernels/batch_norm_bench.cu -o "$work/bench.o"
build() {  # build NAME [PATCH [BASE]]: BASE's (b34a504's) batch_norm.cu and launch.h, PATCH applied (none for fin)
  local name=$1 patch=${2:-} base=${3:-b34a504} d="$work/src_$1"
  mkdir -p "$d/ptrain/kernels/cuda"
  git show $base:src/ptrain/kernels/cuda/batch_norm.cu > "$d/ptrain/kernels/cuda/batch_norm.cu"
  git show $base:src/ptrain/kernels/cuda/launch.h > "$d/ptrain/kernels/cuda/launch.h"
  if [ -n "$patch" ]; then
    (cd "$d" && patch -s -p3 ptrain/kernels/cuda/launch.h < "$work/patches/launch-h-from-b34a504.patch" &&
      patch -s -p3 ptrain/kernels/cuda/batch_norm.cu < "$work/patches/$patch")
  fi
  nvcc $flags -I"$d" -Isrc -c "$d/ptrain/kernels/cuda/batch_norm.cu" -o "$work/bn_$name.o"
  nvcc -arch=sm_90 "$work/bench.o" "$work/bn_$name.o" "$work/max_pool.o" -o .gpu-bin/bn_$name
  echo "built .gpu-bin/bn_$name"
}
build fin
for v in pf pf12 rpt8 rpt4 all all4; do build $v $v-from-b34a504.patch; done
# The variants added when call 4 was run, from 73a09be (launch.h the same as b34a504's): the tree under test
# rebased, plus the statistics' loop pipelined, and for sps folded as shifted sums.
for v in sp sps; do build $v $v-from-73a09be.patch 73a09be; done
