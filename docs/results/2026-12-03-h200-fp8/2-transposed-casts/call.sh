#!/usr/bin/env bash
# FP8 after the transposed casts and the bias epilogue: kernel tests, GPT small/large/xl amp-bf16 vs fp8,
# a trace of gpt-large fp8, then GPT-2 small on a text file for 300 steps in both modes (loss curves).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/r; mkdir -p $R
pack() { tar -czf $OUT/call.tgz -C $OUT r; }
t0=$(date +%s)
if [ -z "${NOBUILD:-}" ]; then
BUILD_TARGETS="${TARGETS:-ptrain test_kernels}" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; tail -3 $R/build.txt
else mkdir -p .gpu-deps/root; for f in .gpu-deps/debs/*.deb; do dpkg -x $f .gpu-deps/root; done; fi
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
echo "build done $(( $(date +%s) - t0 )) s"; pack
timeout 200 build-gpu/tests/kernels/test_kernels --gtest_filter="${KTEST:-*Fp8*:*FP8*}" > $R/ktest.log 2>&1; echo "ktest rc=$?"
grep -E "^\[  (FAILED|PASSED|SKIPPED|  OK) |Failure|rror|Expected|Which is|actual|relative" $R/ktest.log | grep -v "^\[W" | head -40; pack
show() { python3 -c "import json,sys;r=json.load(open(sys.argv[1]));g=2**30;print(' steady tok/s', round(r.get('steady_tokens_per_second') or 0), 'alloc %.2f nvml %.2f GiB' % ((r.get('peak_allocated_bytes') or 0)/g, (r.get('peak_nvml_used_bytes') or 0)/g), 'graphs:', r.get('cuda_graphs'), r.get('cuda_graphs_note') or '', 'test loss', r.get('final_test_loss'), 'fp8:', (r.get('extra') or {}).get('fp8_layers'))" $1 2>&1 | cut -c1-400; }
run() { local name=$1; shift; local st=$(date +%s); timeout ${RUN_TIMEOUT:-150} "$@" --metrics-out $R/$name.json > $R/$name.log 2>&1; echo "$name rc=$? $(( $(date +%s) - st )) s"; show $R/$name.json; grep -iE "error" $R/$name.log | head -3 | cut -c1-300; pack; }
for spec in ${MODELS:-gpt-small:16 gpt-large:8 gpt-xl:8}; do
  IFS=: read m B <<< "$spec"
  for p in ${PRECS:-amp-bf16 fp8 fp8+head}; do
    extra=""; pp=${p%%+*}; [[ $p == *+head ]] && extra="--fp8-head"
    run $m-$p build-gpu/ptrain train --model $m --dataset synthetic-tokens --data-path 480:1024:50257 --batch-size $B --epochs 1 --max-steps ${STEPS:-25} --test-limit 16 --optimizer adamw --lr 3e-4 --warmup-steps 5 --no-eval-each-epoch --progress none --precision $pp $extra
  done
done
echo "speed done $(( $(date +%s) - t0 )) s"
if [ -n "${PROFILE:-}" ]; then
  PROFILE_STEPS=9:10 OUT=$R scripts/gpu_session.sh profile $PROFILE --model gpt-large --dataset synthetic-tokens --data-path 480:1024:50257 --batch-size 8 --epochs 1 --max-steps 12 --test-limit 16 --optimizer adamw --lr 3e-4 --warmup-steps 5 --no-eval-each-epoch --precision fp8 2>&1 | tail -28; rm -f $R/trace-*.json.xz; pack
fi
if [ -n "${TEXT:-}" ]; then
  python3 - <<'PY'
import pathlib, torch
root = pathlib.Path(torch.__file__).parent
out = bytearray()
for f in sorted(root.rglob('*.py')):
    out += f.read_bytes()
    if len(out) >= 16 << 20: break
pathlib.Path('.data/corpus.txt').write_bytes(bytes(out[:16 << 20]))
print('corpus', len(out[:16 << 20]), 'bytes from', root)
PY
  for p in amp-bf16 fp8; do
    run text-$p build-gpu/ptrain train --model gpt-small --dataset text --data-path .data/corpus.txt --seq-len 1024 --batch-size 16 --epochs 1 --max-steps 300 --test-limit 64 --optimizer adamw --lr 6e-4 --warmup-steps 30 --no-eval-each-epoch --progress none --precision $p --log-every 10 --log-jsonl $R/text-$p.jsonl --seed 1
    tail -1 $R/text-$p.jsonl | cut -c1-300
  done
fi
echo "all done $(( $(date +%s) - t0 )) s"; pack
