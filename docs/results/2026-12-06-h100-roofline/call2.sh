#!/usr/bin/env bash
# The second call of 2026-12-06 (about 6 minutes): (1) batch_norm_bench at HEAD (base) against the single-pass
# kernels whose apply phase walks back from where the reduction stopped (rev), run directly, three interleaved rounds;
# meanwhile (2) ptrain builds from this tree; then (3) `ptrain estimate` of the two jobs call.sh measured (ResNet-50
# amp-bf16 at 224 px, batch 128; GPT-2 large amp-bf16, batch 8 of 1,024 tokens), their predictions to set beside the
# peaks those runs measured. Carry .gpu-bin/, .gpu-deps/ and .data/ as call.sh does.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/r; mkdir -p $R
pack() { tar -czf $OUT/call2.tgz.part -C $OUT r && mv $OUT/call2.tgz.part $OUT/call2.tgz; }
t0=$(date +%s)
(BUILD_TARGETS="ptrain" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; echo "build rc $?" > $R/build-rc.txt) &
BP=$!
for round in 1 2 3; do for v in base rev; do
  b=.gpu-bin/batch_norm_bench; [ $v = rev ] && b=${b}_rev
  timeout 60 $b > $R/bn-$v-$round.txt 2>&1; echo "$v round $round rc $? at $(( $(date +%s) - t0 )) s"
done; done
for f in $R/bn-*-[123].txt; do echo "== $f"; grep -E "^total|^# of the" "$f"; done
pack
wait $BP; cat $R/build-rc.txt; tail -n 2 $R/build.txt
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
timeout 120 build-gpu/ptrain estimate --config .data/r50.yaml --precision amp-bf16 --devices 1 --json $R/est-r50.json > $R/est-r50.txt 2>&1
echo "estimate r50 rc $? at $(( $(date +%s) - t0 )) s"; cat $R/est-r50.txt | head -8; pack
timeout 150 build-gpu/ptrain estimate --model gpt-large --dataset synthetic-tokens --data-path 240:1024:50257 --batch-size 8 --epochs 1 --max-steps 30 --test-limit 16 --optimizer adamw --lr 3e-4 --warmup-steps 5 --schedule cosine --precision amp-bf16 --devices 1 --json $R/est-gpt-large.json > $R/est-gpt-large.txt 2>&1
echo "estimate gpt-large rc $? at $(( $(date +%s) - t0 )) s"; cat $R/est-gpt-large.txt | head -8; pack
echo "end $(( $(date +%s) - t0 )) s"
