#!/usr/bin/env bash
# Session 12 call 3: the 5-epoch reference in amp-bf16 and fp16 with master weights; GPT-2 small amp-bf16 and
# ResNet-50 tf32 beside PyTorch compiled with CUDA graphs (.data/s12.yaml).
R=$OUT/r; mkdir -p $R
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
pack() { tar -czf $OUT/call.tgz -C $OUT r; }
t0=$(date +%s)
BUILD_TARGETS="ptrain" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; echo "build rc $?"
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
echo "build done $(( $(date +%s) - t0 )) s"; pack
OUT=$R timeout 100 scripts/gpu_session.sh reference amp-bf16 > $R/reference-amp-bf16.txt 2>&1; grep -E "result|^epoch" $R/reference-amp-bf16.txt | tail -n 3
echo "reference done $(( $(date +%s) - t0 )) s"; pack
left=$(( 480 - ($(date +%s) - t0) ))
OUT=$R timeout $((left + 60)) scripts/gpu_session.sh bench s12 --suite .data/s12.yaml --pytorch --no-estimate --time-limit $left --run-timeout 200 > $R/bench.txt 2>&1
echo "bench rc $?"; tail -n 5 $R/bench.txt
tar -xzf $R/bench-s12.tgz -C $R 2>/dev/null; cat $R/s12/side-by-side.csv 2>/dev/null | cut -c1-400
echo "bench done $(( $(date +%s) - t0 )) s"; pack
left=$(( 575 - ($(date +%s) - t0) ))
[ $left -gt 70 ] && { OUT=$R timeout $left scripts/gpu_session.sh reference fp16+master > $R/reference-fp16-master.txt 2>&1; grep -E "result|^epoch" $R/reference-fp16-master.txt | tail -n 3; }
echo "all done $(( $(date +%s) - t0 )) s"; pack
