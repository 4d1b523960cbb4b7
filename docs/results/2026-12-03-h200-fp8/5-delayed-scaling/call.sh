#!/usr/bin/env bash
# Next: delayed scaling's first GPU run. Kernel tests, gpt-large/xl amp-bf16 vs fp8 dynamic vs fp8 delayed (with
# and without --fp8-head), then 300 text steps in delayed. ~330 s of wall after a ~100 s build.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/r; mkdir -p $R
pack() { tar -czf $OUT/call.tgz -C $OUT r; }
t0=$(date +%s)
BUILD_TARGETS="ptrain test_kernels" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; tail -2 $R/build.txt
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
echo "build done $(( $(date +%s) - t0 )) s"; pack
timeout 200 build-gpu/tests/kernels/test_kernels > $R/ktest.log 2>&1; echo "ktest rc=$?"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|Expected|Which is|relative|differ|history" $R/ktest.log | head -30; pack
show() { python3 -c "import json,sys;r=json.load(open(sys.argv[1]));g=2**30;print(' steady tok/s', round(r.get('steady_tokens_per_second') or 0), 'alloc %.2f nvml %.2f GiB' % ((r.get('peak_allocated_bytes') or 0)/g, (r.get('peak_nvml_used_bytes') or 0)/g), 'graphs:', r.get('cuda_graphs'), 'test loss', r.get('final_test_loss'), 'fp8:', (r.get('extra') or {}).get('fp8_layers'))" $1 2>&1 | cut -c1-400; }
run() { local name=$1; shift; local st=$(date +%s); timeout 150 "$@" --metrics-out $R/$name.json > $R/$name.log 2>&1; echo "$name rc=$? $(( $(date +%s) - st )) s"; show $R/$name.json; grep -iE "error" $R/$name.log | head -3 | cut -c1-300; pack; }
G="--dataset synthetic-tokens --data-path 480:1024:50257 --epochs 1 --max-steps 25 --test-limit 16 --optimizer adamw --lr 3e-4 --warmup-steps 5 --no-eval-each-epoch --progress none"
for m in gpt-large gpt-xl; do
  run $m-amp-bf16 build-gpu/ptrain train --model $m --batch-size 8 $G --precision amp-bf16
  run $m-fp8 build-gpu/ptrain train --model $m --batch-size 8 $G --precision fp8
  run $m-fp8-delayed build-gpu/ptrain train --model $m --batch-size 8 $G --precision fp8 --fp8-scaling delayed
  run $m-fp8-delayed-head build-gpu/ptrain train --model $m --batch-size 8 $G --precision fp8 --fp8-scaling delayed --fp8-head
done
python3 - <<'PY'
import pathlib, torch
out = bytearray()
for f in sorted(pathlib.Path(torch.__file__).parent.rglob('*.py')):
    out += f.read_bytes()
    if len(out) >= 16 << 20: break
pathlib.Path('.data/corpus.txt').write_bytes(bytes(out[:16 << 20]))
PY
for p in "amp-bf16" "fp8 --fp8-scaling delayed"; do
  n=text-${p// /}; n=${n//--fp8-scaling/-}
  run $n build-gpu/ptrain train --model gpt-small --dataset text --data-path .data/corpus.txt --seq-len 1024 --batch-size 16 --epochs 1 --max-steps 300 --test-limit 64 --optimizer adamw --lr 6e-4 --warmup-steps 30 --no-eval-each-epoch --progress none --precision $p --log-every 10 --log-jsonl $R/$n.jsonl --seed 1
done
echo "all done $(( $(date +%s) - t0 )) s"; pack
