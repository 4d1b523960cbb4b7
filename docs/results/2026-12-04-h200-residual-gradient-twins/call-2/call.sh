#!/usr/bin/env bash
# Session 13 call 2: batch-norm bench variants (stats as shifted sums, a tree merge; rows in flight; bounds),
# built here from copies of batch_norm.cu, while the tree builds; then the GPU tests and ResNet-50 runs.
R=$OUT/r; mkdir -p $R
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
pack() { tar -czf $OUT/call.tgz -C $OUT r; }
t0=$(date +%s)
(BUILD_TARGETS="ptrain test_kernels batch_norm_bench" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; echo "build rc $?" > $R/build-rc.txt) &
BP=$!
for v in v0 v1 v2 v3 v4 v5 v6 v7; do
  timeout 40 .data/var/bnb-$v --dtype bf16 > $R/bench-bf16-$v.txt 2>&1; echo "$v rc $? $(tail -n 2 $R/bench-bf16-$v.txt | head -1)"
done
pack
wait $BP; cat $R/build-rc.txt
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
echo "build done $(( $(date +%s) - t0 )) s"
timeout 100 ./build-gpu/tests/kernels/test_kernels --gtest_filter='FusedBatchNorm*:Captured*:FusedKernels*' > $R/tests.txt 2>&1; echo "tests rc $?"
grep -E "^\[  (FAILED|PASSED) |Failure" $R/tests.txt | head -20; pack
show() { python3 -c "
import json,sys;r=json.load(open(sys.argv[1]));g=2**30
print(' steady %.1f' % (r.get('steady_images_per_second') or 0), 'alloc %.2f reserved %.2f nvml %.2f' % ((r.get('peak_allocated_bytes') or 0)/g, (r.get('peak_reserved_bytes') or 0)/g, (r.get('peak_nvml_used_bytes') or 0)/g), 'graphs', r.get('cuda_graphs'))" $1 2>&1 | cut -c1-300; }
ptr() {
  local N=$1; shift
  timeout 60 build-gpu/ptrain train --config .data/r50.yaml --progress none --metrics-out $R/ptrain-$N.json "$@" > $R/ptrain-$N.log 2>&1
  echo "ptrain-$N rc=$?"; show $R/ptrain-$N.json; pack
}
ptr amp-bf16 --precision amp-bf16
ptr tf32 --precision tf32
ptr bf16 --precision bf16
for v in v0 v1 v3; do
  timeout 40 .data/var/bnb-$v --dtype fp32 > $R/bench-fp32-$v.txt 2>&1; echo "$v fp32 rc $? $(tail -n 2 $R/bench-fp32-$v.txt | head -1)"
done
pack
echo "all done $(( $(date +%s) - t0 )) s"
