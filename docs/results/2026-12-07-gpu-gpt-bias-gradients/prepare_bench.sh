#!/usr/bin/env bash
# Builds gpt_block_bench twice for sm_90 on this machine (nvcc, no GPU needed), into .gpu-bin/ (git-ignored, carried
# to the device): gbb_head from the tree as it is, gbb_resident with ln-resident.patch applied to a copy of
# src/ptrain/kernels/cuda/ (the LayerNorm forward and backward holding each row in registers). call2.sh runs both,
# interleaved, when it finds them. About a minute on two cores.
set -euo pipefail
cd "$(dirname "$0")/../../.."
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
D=docs/results/2026-12-07-gpu-gpt-bias-gradients
mkdir -p .gpu-bin
build() {  # NAME SRC_ROOT
  local name=$1 root=$2 tmp
  tmp=$(mktemp -d)
  "$NVCC" -std=c++17 -O3 -arch=sm_90 -I"$root" -c bench/kernels/gpt_block_bench.cu -o "$tmp/bench.o"
  "$NVCC" -std=c++17 -O3 --use_fast_math -lineinfo -arch=sm_90 -I"$root" -c "$root/ptrain/kernels/cuda/layer_norm.cu" -o "$tmp/layer_norm.o"
  "$NVCC" -std=c++17 -O3 -lineinfo -arch=sm_90 -I"$root" -c "$root/ptrain/kernels/cuda/linear.cu" -o "$tmp/linear.o"
  "$NVCC" -arch=sm_90 "$tmp/bench.o" "$tmp/layer_norm.o" "$tmp/linear.o" -o ".gpu-bin/$name"
  rm -rf "$tmp"
  echo "built .gpu-bin/$name"
}
build gbb_head src
variant=$(mktemp -d)
mkdir -p "$variant/src" && cp -r src/ptrain "$variant/src/"
# The patch was written against 746d116's layer_norm.cu (before its forward took its output's amax for FP8).
git show 746d116:src/ptrain/kernels/cuda/layer_norm.cu > "$variant/src/ptrain/kernels/cuda/layer_norm.cu"
(cd "$variant" && git apply --unidiff-zero "$OLDPWD/$D/ln-resident.patch" 2>/dev/null || patch -p1 -s < "$OLDPWD/$D/ln-resident.patch")
build gbb_resident "$variant/src"
rm -rf "$variant"
