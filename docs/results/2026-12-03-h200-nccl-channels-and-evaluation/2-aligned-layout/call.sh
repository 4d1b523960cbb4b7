#!/usr/bin/env bash
# Issue 23 after the 16-byte aligned flat layout and the one-channel NCCL group at world size 1: GPT-2 small under
# every strategy (untraced), zero3 traced, then the strategies suite.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/r; mkdir -p $R
pack() { tar -czf $OUT/call.tgz -C $OUT r; }
t0=$(date +%s)
mkdir -p .data/cifar10 && tar -xJf .data/cifar10-jpg.tar.xz -C .data/cifar10 &
if [ -z "${NOBUILD:-}" ]; then
BUILD_TARGETS="${TARGETS:-ptrain}" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; tail -3 $R/build.txt
else mkdir -p .gpu-deps/root; for f in .gpu-deps/debs/*.deb; do dpkg -x $f .gpu-deps/root; done; fi
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
echo "build done $(( $(date +%s) - t0 )) s"; pack
for v in NCCL_MAX_CTAS=1 X=base; do echo "== $v"; env $v python3 scripts/nccl_memory_probe.py 2>&1 | grep -vE "^\[W|Warning" | tr '\n' ' '; echo; done
show() { python3 -c "import json,sys;r=json.load(open(sys.argv[1]));g=2**30;print(' steady seq/s', r.get('steady_images_per_second'), 'alloc %.2f reserved %.2f nvml %.2f GiB' % ((r.get('peak_allocated_bytes') or 0)/g, (r.get('peak_reserved_bytes') or 0)/g, (r.get('peak_nvml_used_bytes') or 0)/g), 'graphs:', r.get('cuda_graphs'), r.get('cuda_graphs_note') or '', 'phases', {k: round(v*1000,2) for k,v in (r.get('step_phase_seconds') or {}).items()})" $1 2>&1 | cut -c1-500; }
GPT="--model gpt-small --dataset synthetic-tokens --data-path 800:1024:50257 --batch-size 16 --epochs 1 --max-steps 40 --test-limit 32 --optimizer adamw --lr 6e-4 --warmup-steps 5 --no-eval-each-epoch --progress none --precision amp-bf16"
for S in ${STRATS:-single ddp zero1 zero2 zero3 fsdp zero3:trace}; do
  st=$(date +%s); name=${S/:/-}; S=${S%%:*}
  prof=""; [[ $name == *trace ]] && prof="--profile-out $R/trace-$S.json --profile-steps 30:32"
  L="build-gpu/ptrain launch --nproc-per-node 1 --"; [ $S = single ] && L=""
  timeout 200 $L build-gpu/ptrain train $GPT --strategy $S $prof --metrics-out $R/$name.json > $R/$name.log 2>&1
  echo "$name rc=$? $(( $(date +%s) - st )) s"; show $R/$name.json; grep -iE "error" $R/$name.log | head -3 | cut -c1-300
  if [ -f $R/trace-$S.json ]; then python3 scripts/trace_summary.py $R/trace-$S.json --steps 3 --top 30 > $R/summary-$S.txt 2>&1; head -24 $R/summary-$S.txt; xz -T8 -6 $R/trace-$S.json; fi
  pack
done
wait
if [ -n "${SUITE:-1}" ]; then
  timeout ${LIMIT:-400} build-gpu/ptrain bench --suite strategies --no-estimate --run-timeout 200 --out $R/strategies > $R/suite.log 2>&1; echo "suite rc=$?"
  tail -30 $R/suite.log | cut -c1-250
  [ -f $R/strategies/report.md ] && grep -E "^\|" $R/strategies/report.md | head -30 | cut -c1-300
fi
echo "all done $(( $(date +%s) - t0 )) s"; pack
