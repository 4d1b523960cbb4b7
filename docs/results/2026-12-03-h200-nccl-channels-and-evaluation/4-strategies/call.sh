#!/usr/bin/env bash
# The strategies suite (issue 23), on the build the last call left.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/r; mkdir -p $R
pack() { tar -czf $OUT/call.tgz -C $OUT r; }
t0=$(date +%s)
mkdir -p .data/cifar10 && tar -xJf .data/cifar10-jpg.tar.xz -C .data/cifar10
mkdir -p .gpu-deps/root; for f in .gpu-deps/debs/*.deb; do dpkg -x $f .gpu-deps/root; done
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
ls -la build-gpu/ptrain | head -2; git log --oneline -1
timeout ${LIMIT:-540} build-gpu/ptrain bench --suite strategies --no-estimate --run-timeout 200 --out $R/strategies > $R/suite.log 2>&1; echo "suite rc=$?"
tail -4 $R/suite.log | cut -c1-250
[ -f $R/strategies/report.md ] && grep -E "^\|" $R/strategies/report.md | head -16 | cut -d'|' -f2,8,9,10,12,15 
echo "all done $(( $(date +%s) - t0 )) s"; pack
