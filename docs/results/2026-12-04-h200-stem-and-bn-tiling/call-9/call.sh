#!/usr/bin/env bash
# Session 11 call 7: a trace of the amp-bf16 step at the tree of call 6 (per-kernel times of the stem and pooling).
R=$OUT/r; mkdir -p $R
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
pack() { tar -czf $OUT/call.tgz -C $OUT r; }
t0=$(date +%s)
if [ ! -x build-gpu/ptrain ]; then BUILD_TARGETS="ptrain" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; echo "build rc $?"; fi
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
[ -d .data/cifar10/train ] || { mkdir -p .data/cifar10 && tar -xJf .data/cifar10-jpg.tar.xz -C .data/cifar10; }
echo "build done $(( $(date +%s) - t0 )) s"
PROFILE_STEPS=20:21 OUT=$R timeout 80 scripts/gpu_session.sh profile r50-amp-bf16 --config .data/r50.yaml --precision amp-bf16 --no-eval-each-epoch > $R/profile-amp-bf16.txt 2>&1
grep -E "busy|normalization|convolution|matmul|steady" $R/profile-amp-bf16.txt | head -6 | cut -c1-200
python3 .data/bn_calls.py $R/trace-r50-amp-bf16.json.xz 2 > $R/calls-amp-bf16.txt 2>&1
grep -E "max_pool|space_to_depth|ImplicitGemmConvolution|grid=\[15, 7" $R/calls-amp-bf16.txt | head
echo "all done $(( $(date +%s) - t0 )) s"; pack
