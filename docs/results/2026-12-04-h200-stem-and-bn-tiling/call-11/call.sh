#!/usr/bin/env bash
# Session 11 call 8: max pooling's backward with its 2x2 loop unrolled; its tests; amp-bf16 speed and trace.
R=$OUT/r; mkdir -p $R
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
pack() { tar -czf $OUT/call.tgz -C $OUT r; }
t0=$(date +%s)
ls -d .gpu-deps build-gpu > $R/present.txt 2>&1 || { echo "machine is fresh: $(cat $R/present.txt)"; exit 3; }
BUILD_TARGETS="ptrain test_kernels" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; echo "build rc $?"
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
echo "build done $(( $(date +%s) - t0 )) s"; pack
timeout 60 ./build-gpu/tests/kernels/test_kernels --gtest_filter='MaxPool*:FusedKernels.ResNet50*' > $R/tests.txt 2>&1; echo "tests rc $?"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[==|Failure|evaluates|actual|Which is" $R/tests.txt | head -30; pack
show() { python3 -c "
import json,sys;r=json.load(open(sys.argv[1]));g=2**30;k=r.get('kernels') or {}
print(' steady %.1f' % (r.get('steady_images_per_second') or 0), 'alloc %.2f reserved %.2f nvml %.2f' % ((r.get('peak_allocated_bytes') or 0)/g, (r.get('peak_reserved_bytes') or 0)/g, (r.get('peak_nvml_used_bytes') or 0)/g), 'stem', k.get('stem_conv'))" $1 2>&1 | cut -c1-300; }
for P in amp-bf16 amp-fp16; do
  n=ptrain-$P
  timeout 90 build-gpu/ptrain train --config .data/r50.yaml --precision $P --progress none --metrics-out $R/$n.json > $R/$n.log 2>&1
  echo "$n rc=$?"; show $R/$n.json; pack
done
PROFILE_STEPS=20:21 OUT=$R timeout 80 scripts/gpu_session.sh profile r50-amp-bf16 --config .data/r50.yaml --precision amp-bf16 --no-eval-each-epoch > $R/profile-amp-bf16.txt 2>&1
grep -E "busy" $R/profile-amp-bf16.txt | head -2 | cut -c1-200
python3 .data/bn_calls.py $R/trace-r50-amp-bf16.json.xz 2 > $R/calls-amp-bf16.txt 2>&1
grep -E "max_pool|space_to_depth" $R/calls-amp-bf16.txt | head
echo "all done $(( $(date +%s) - t0 )) s"; pack
