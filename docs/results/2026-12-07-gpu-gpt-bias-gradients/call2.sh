#!/usr/bin/env bash
# Call 2, run on 2026-12-08 (one H100). It replaced call 1, which was never run (no device machine was lent in the
# session that wrote it): the parity step adds the FP8 tests (Fp8*), and GPT-2 large in FP8 with and without
# --skip-fusions fp8-amax takes the place of call 1's GPT-2 XL runs (one round each of every fusion,
# --skip-fusions bias-gradients and --skip-fusions residual-adds at gpt-xl). Call 1's header, as written: One device call, about 9 minutes, carry
# [".gpu-deps", ".data", ".gpu-bin"]: bash scripts/fetch-gpu-deps.sh, mkdir -p .data && cp
# ../shared/data/cifar10-jpg.tar.xz .data/ (GPT trains on synthetic tokens, but gpu_session.sh's build and profile
# steps unpack the archive first), and bash docs/results/2026-12-07-gpu-gpt-bias-gradients/prepare_bench.sh (the two
# LayerNorm builds of gpt_block_bench, 14 MB; without them that step is left out):
#   bash docs/results/2026-12-07-gpu-gpt-bias-gradients/call1.sh (now call2.sh)
# (1) builds ptrain, test_kernels and gpt_block_bench (BUILT=1: the caller did, in the same call); (2) the parity tests
# of the new kernels first (FusedLinear.*, FusedAddLayerNorm.*), and stops there if they fail: a wrong gradient is not
# timed; then gpt_block_bench, the kernels alone against a copy of the same bytes;
# (3) GPT-2 large in amp-bf16 with every fusion, with --skip-fusions bias-gradients and with --skip-fusions
# residual-adds, interleaved, two rounds, then GPT-2 XL one round of each; (4) a trace of two GPT-2 large steps with every fusion, summed by kernel family
# (scripts/trace_summary.py), to set beside the 2026-12-03 trace (docs/results/2026-12-03-h200-fp8/raw.tar.xz,
# 1-before/summary-l-amp-bf16.txt); (5) PyTorch compiled with CUDA graphs on the same GPT-2 large job, for the ratio;
# (6) the rest of test_kernels. Everything lands in $OUT/g2 and $OUT/g2.tgz, packed after each step.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/g2; mkdir -p $R
pack() { tar -czf $OUT/g2.tgz.part -C $OUT g2 && mv $OUT/g2.tgz.part $OUT/g2.tgz; }
t0=$(date +%s)
left() { echo $(( ${1} - ($(date +%s) - t0) )); }  # seconds left of a budget of $1 from the call's start
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total,driver_version --format=csv | tee $R/gpu.txt
git log -1 --format="%H %s" > $R/commit.txt 2>/dev/null || true
if [ -z "${BUILT:-}" ]; then
  BUILD_TARGETS="ptrain test_kernels gpt_block_bench" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1
  echo "build rc $? at $(( $(date +%s) - t0 )) s"; tail -n 2 $R/build.txt
fi
export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
timeout 90 ./build-gpu/tests/kernels/test_kernels --gtest_filter='FusedLinear.*:FusedAddLayerNorm.*:Fp8*' > $R/parity.log 2>&1
parity=$?
echo "parity rc $parity at $(( $(date +%s) - t0 )) s"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|Expected|Which is|dbias|dweight|dx" $R/parity.log | head -30
pack
[ $parity -eq 0 ] || { echo "parity failed: nothing timed"; exit 1; }

# The kernels alone at GPT-2 small, large and XL's widths, beside a copy of the same bytes (bench/kernels).
bench=$(find build-gpu -name gpt_block_bench -type f -perm -u+x | head -1)
[ -n "$bench" ] && { timeout 60 $bench > $R/gpt-block-bench.txt 2>&1; echo "gpt_block_bench rc $?"; cat $R/gpt-block-bench.txt; }
# prepare_bench.sh's two builds, when carried: the LayerNorm as committed and with ln-resident.patch, interleaved.
if [ -x .gpu-bin/gbb_head ] && [ -x .gpu-bin/gbb_resident ]; then
  for round in 1 2; do
    for v in head resident; do
      timeout 60 .gpu-bin/gbb_$v --widths 768,1280,1600 > $R/gbb-$v-$round.txt 2>&1; echo "gbb_$v round $round rc $?"
    done
  done
  for f in $R/gbb-*-[12].txt; do echo "== $f"; grep -E "^ln " "$f"; done
fi
pack

show() { python3 -c "import json,sys;r=json.load(open(sys.argv[1]));g=2**30;k=r.get('kernels') or {};print(' steady tok/s', round(r.get('steady_tokens_per_second') or 0), 'alloc %.2f nvml %.2f GiB' % ((r.get('peak_allocated_bytes') or 0)/g, (r.get('peak_nvml_used_bytes') or 0)/g), 'graphs', r.get('cuda_graphs'), 'mfu', r.get('mfu'), 'skipped', k.get('skipped_fusions'), 'loss', r.get('final_train_loss'))" $1 2>&1 | cut -c1-400; }
run() { local name=$1; shift; local st=$(date +%s); timeout 120 "$@" --metrics-out $R/$name.json > $R/$name.log 2>&1; echo "$name rc=$? $(( $(date +%s) - st )) s"; show $R/$name.json; grep -iE "error" $R/$name.log | head -3 | cut -c1-300; pack; }
G="--dataset synthetic-tokens --data-path 480:1024:50257 --batch-size 8 --epochs 1 --max-steps 30 --test-limit 16 --optimizer adamw --lr 3e-4 --warmup-steps 5 --seed 1 --no-eval-each-epoch --progress none --precision amp-bf16"
for round in 1 2; do
  run large-fused-$round build-gpu/ptrain train --model gpt-large $G
  run large-no-bias-gradients-$round build-gpu/ptrain train --model gpt-large $G --skip-fusions bias-gradients
  run large-no-residual-adds-$round build-gpu/ptrain train --model gpt-large $G --skip-fusions residual-adds
done
F=${G/--precision amp-bf16/--precision fp8}
run fp8-fused-1 build-gpu/ptrain train --model gpt-large $F
run fp8-no-fp8-amax-1 build-gpu/ptrain train --model gpt-large $F --skip-fusions fp8-amax
python3 - "$R" <<'PY' | tee $R/ab.txt
import json, pathlib, statistics, sys
r = pathlib.Path(sys.argv[1])
def tok(name):
    try: return json.loads((r / f"{name}.json").read_text()).get("steady_tokens_per_second") or 0
    except Exception: return 0
for model, rounds, names in (("large", 2, ("fused", "no-bias-gradients", "no-residual-adds")),
                             ("fp8", 1, ("fused", "no-fp8-amax"))):
    arms = {arm: [tok(f"{model}-{arm}-{i}") for i in range(1, rounds + 1)] for arm in names}
    full = statistics.median(arms["fused"])
    for arm, runs in arms.items():
        m = statistics.median(runs)
        print(f"gpt-{model} {arm}: {m:,.0f} tok/s (runs {[round(x) for x in runs]}); every fusion / this: "
              f"{full / m if m else float('nan'):.3f}")
PY
pack
PROFILE_STEPS=20:21 OUT=$R timeout 120 scripts/gpu_session.sh profile l-amp-bf16 --model gpt-large ${G/--progress none/} > $R/profile.txt 2>&1
echo "profile rc $? at $(( $(date +%s) - t0 )) s"; head -n 30 $R/summary-l-amp-bf16.txt 2>/dev/null
pack
budget=$(left 540)
if [ "$budget" -gt 60 ]; then
  timeout "$budget" python3 bench/pytorch_reference.py --model gpt-large --dataset synthetic-tokens --data 480:1024:50257 \
    --batch-size 8 --epochs 1 --max-steps 30 --optimizer adamw --lr 3e-4 --warmup-steps 5 --seed 1 --precision amp-bf16 \
    --compile --compile-mode reduce-overhead --fused-optimizer --no-eval --metrics-out $R/pytorch-large-compiled.json \
    > $R/pytorch-large-compiled.log 2>&1
  echo "pytorch compiled rc $? at $(( $(date +%s) - t0 )) s"; show $R/pytorch-large-compiled.json
fi
pack
budget=$(left 590)
[ "$budget" -gt 20 ] && { timeout "$budget" ./build-gpu/tests/kernels/test_kernels > $R/kernel-tests.log 2>&1
  echo "kernel tests rc $? at $(( $(date +%s) - t0 )) s"; grep -E "^\[  (FAILED|PASSED) |tests ran" $R/kernel-tests.log | head; }
pack
echo "end $(( $(date +%s) - t0 )) s"
