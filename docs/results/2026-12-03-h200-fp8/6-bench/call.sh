#!/usr/bin/env bash
# The fp8 suite with PyTorch compiled beside it. Run again within 30 s to continue (build kept, cache kept).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/r; mkdir -p $R
t0=$(date +%s)
BUILD_TARGETS="ptrain" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; tail -2 $R/build.txt
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
left=$(( ${LIMIT:-570} - ($(date +%s) - t0) ))
echo "build done $(( $(date +%s) - t0 )) s; bench gets $left s"
build-gpu/ptrain bench --suite fp8 --pytorch --no-estimate --time-limit $left --run-timeout 420 --out .bench/fp8 > $R/bench.txt 2>&1
echo "bench rc=$?"; tail -40 $R/bench.txt
tar -czf $OUT/bench.tgz --exclude='pytorch-cache' .bench/fp8 $R/bench.txt $R/build.txt 2>/dev/null
echo "all done $(( $(date +%s) - t0 )) s"
