#!/usr/bin/env bash
# Everything ptrain does on a GPU machine (PyTorch 2.x wheel, CUDA LibTorch, no package registry), in one
# script so that a single remote call builds, checks and measures. Steps, in the order given:
#   build                 unpack the carried .debs, configure against the wheel's LibTorch, build build-gpu/
#   test                  ctest on that build (the CPU suites and oracles, against LibTorch 2.x)
#   smoke STEPS           every precision mode for STEPS steps, ptrain then PyTorch eager, same data
#   reference MODE...     the reference workload (configs/cifar10-resnet50-224.yaml, 5 epochs) per MODE,
#                         a MODE being a precision name, optionally +master or +cl (channels-last)
#   pytorch MODE...       the same workload in PyTorch eager (bench/pytorch_reference.py)
#   multi STRATEGY MODE...  dp, ddp, zero1-3 or fsdp on every GPU, ptrain then PyTorch's counterpart
#   bench NAME FLAGS...   `ptrain bench FLAGS` into .bench/NAME (carry .bench to continue an interrupted
#                         bench in a later call), packed into $OUT/bench-NAME.tgz (one file comes back
#                         where many would be cut), e.g. as docs/results/2026-11-30-h200-bench.md ran it:
#                         bench h200-x2 --suite standard --pytorch --side-by-side --set max-steps=50 ...
#   profile NAME FLAGS... one short `ptrain train FLAGS` run traced (--profile-out), its record and the trace's
#                         summary (scripts/trace_summary.py) in $OUT, the trace packed into $OUT/trace-NAME.json.xz
#   kernel-tests          the fused-kernel parity tests (tests/kernels) alone
# BUILD_TARGETS (e.g. "ptrain test_kernels") builds only those targets.
# LIMIT adds flags to reference, pytorch and multi runs (e.g. LIMIT="--max-steps 390"); TAG suffixes
# their file names; RUN_TIMEOUT (seconds) stops a multi run that takes longer, so that the next one runs;
# SKIP_PYTORCH=1 leaves out multi's PyTorch run (when another step measures the same counterpart).
#   reference-check       the PyTorch reference's GPU-only paths (torch.compile, fused optimizers, a bench of
#                         two workloads beside PyTorch eager and compiled, ptrain's GPT init on 2.x), about
#                         three minutes: tests/bench/pytorch_reference_gpu_check.py, packed into $OUT
#   keep-binary           copy build-gpu/ptrain to $OUT/bin, so that a later call can carry it in .gpu-bin/
#   prebuilt              unpack the carried .debs and use the carried .gpu-bin/ptrain instead of building
#   diagnose FILTER       run the test binaries' cases matching FILTER alone, under gdb (or cuda-gdb)
#   dp-probe MODE         PyTorch's DataParallel for 40 logged steps, every thread's stack if it stalls
# Two lanes run side by side on a two-GPU machine with CUDA_VISIBLE_DEVICES set per lane; each run is
# then alone on its GPU (the lanes share the host's cores).
# Results (JSON per run, logs) go to $OUT (or runs/gpu). Data comes from the carried
# .data/cifar10-jpg.tar.xz. NVLink multicast stays off, as the machine's operators require.
set -euo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-runs/gpu}
mkdir -p "$OUT"
DEPS=$PWD/.gpu-deps/root
export LD_LIBRARY_PATH=$DEPS/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
DATA=.data/cifar10
EPOCHS=${EPOCHS:-5}

ensure_data() {
  if [ ! -d $DATA/train ]; then
    mkdir -p $DATA && tar -xJf .data/cifar10-jpg.tar.xz -C $DATA
  fi
}

mode_flags() {  # MODE -> ptrain flags
  local mode=$1 flags
  flags="--precision ${mode%%+*}"
  [[ $mode == *+master* ]] && flags="$flags --master-weights"
  [[ $mode == *+cl* ]] && flags="$flags --channels-last"
  echo "$flags"
}

unpack_deps() {
  rm -rf "$DEPS" && mkdir -p "$DEPS"
  for f in .gpu-deps/debs/*.deb; do dpkg -x "$f" "$DEPS"; done
}

# build_gpu LOG: builds build-gpu (BUILD_TARGETS if set) into LOG; on failure prints its errors, returns 1.
build_gpu() {
  cmake --build build-gpu -j "$(nproc)" ${BUILD_TARGETS:+--target $BUILD_TARGETS} -- -k 0 > "$1" 2>&1 && return 0
  { grep -E "error|Error|FAILED" -A4 "$1" | grep -vE "^\s+(from|inlined)" | head -n 60; } || true
  return 1
}

step_build() {
  unpack_deps
  ensure_data
  local torch_prefix
  torch_prefix=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$torch_prefix;$DEPS/usr;$DEPS/usr/lib/x86_64-linux-gnu/cmake;$DEPS/usr/share/cmake" \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DTORCH_CUDA_ARCH_LIST=9.0 -DPTRAIN_ORACLE_PYTHON="$(command -v python3)" \
    -DPTRAIN_CUDNN_ROOT="$(python3 -c 'import nvidia.cudnn; print(nvidia.cudnn.__path__[0])' 2>/dev/null)" \
    2>&1 | tail -n 25
  if ! build_gpu "$OUT/build.log"; then
    # A unity batch that fails on LibTorch 2.x alone (two files' private helpers meeting, or a compiler crash
    # such as GCC 13's on nvml.cpp) must not cost the call: the errors above say which files to compile
    # alone; the build goes on one file at a time.
    if grep -q "PTRAIN_UNITY_BUILD:BOOL=ON" build-gpu/CMakeCache.txt; then
      echo "== unity build failed; building again with -DPTRAIN_UNITY_BUILD=OFF"
      cmake -S . -B build-gpu -DPTRAIN_UNITY_BUILD=OFF > /dev/null
      build_gpu "$OUT/build-no-unity.log" || true
    fi
  fi
  test -x build-gpu/ptrain
}

step_keep_binary() {
  mkdir -p "$OUT/bin" && cp build-gpu/ptrain "$OUT/bin/ptrain" && ls -la "$OUT/bin"
}

step_prebuilt() {
  unpack_deps
  ensure_data
  # A warm machine still has the binary an earlier call built (build-gpu may link to a folder outside the
  # carried tree); otherwise the carried one.
  if [ ! -x build-gpu/ptrain ]; then
    mkdir -p build-gpu && cp .gpu-bin/ptrain build-gpu/ptrain && chmod +x build-gpu/ptrain
  fi
  build-gpu/ptrain --help > /dev/null
}

step_diagnose() {
  local filter=$1 bin
  for bin in build-gpu/tests/*/test_*; do
    [ -x "$bin" ] || continue
    [ "$("$bin" --gtest_list_tests --gtest_filter="$filter" | grep -c '^  ')" -gt 0 ] || continue
    echo "== $bin --gtest_filter=$filter"
    local debugger
    debugger=$(command -v gdb || command -v cuda-gdb || true)  # the GPU image has cuda-gdb only
    if [ -n "$debugger" ]; then
      "$debugger" -q -batch -ex run -ex bt --args "$bin" --gtest_filter="$filter" 2>&1 | grep -vE "^\[(New|Thread)" | tail -n 60
    else
      "$bin" --gtest_filter="$filter" 2>&1 | tail -n 60 || echo "exit status $?"
    fi
  done
}

step_test() {
  (cd build-gpu && ctest --output-on-failure -j 8 --timeout 600 2>&1 | tail -n 40) | tee "$OUT/ctest.log"
}

step_smoke() {
  local steps=$1
  ensure_data
  for mode in fp32 tf32 fp16 fp16+master bf16 amp-fp16 amp-bf16 amp-bf16+cl; do
    echo "== ptrain $mode ($steps steps)"
    ./build-gpu/ptrain train --config configs/cifar10-resnet50-224.yaml $(mode_flags $mode) --max-steps "$steps" \
      --warmup-epochs 0 --no-eval-each-epoch --test-limit 2000 --progress lines --log-every 50 \
      --metrics-out "$OUT/smoke-ptrain-$mode.json" 2>&1 | grep -E "result|error|epoch 1" | tail -n 5
    echo "== pytorch $mode ($steps steps)"
    local cl=""
    [[ $mode == *+cl* ]] && cl="--channels-last"
    [[ $mode == *+master* ]] && continue  # PyTorch has no built-in master weights for pure half
    python3 bench/pytorch_reference.py --data $DATA --precision "${mode%%+*}" $cl --max-steps "$steps" \
      --warmup-epochs 0 --no-eval --metrics-out "$OUT/smoke-pytorch-$mode.json" 2>&1 | grep -E "\[pytorch\].*img/s, peak" || true
  done
}

# File names carry no '+' (the device tool returns only plain names): fp16+master -> fp16_master.
file_tag() { local mode=$1; echo "${mode//+/_}${TAG:-}"; }

step_reference() {
  ensure_data
  for mode in "$@"; do
    local name
    name=$(file_tag "$mode")
    echo "== ptrain $mode ($EPOCHS epochs ${LIMIT:-})"
    ./build-gpu/ptrain train --config configs/cifar10-resnet50-224.yaml $(mode_flags $mode) --epochs "$EPOCHS" \
      ${LIMIT:-} --progress lines --log-every 100 --metrics-out "$OUT/reference-ptrain-$name.json" 2>&1 \
      | tee "$OUT/reference-ptrain-$name.log" | grep -E "^epoch [0-9]+:|result|rror"
  done
}

step_pytorch() {
  ensure_data
  for mode in "$@"; do
    local cl="" name
    name=$(file_tag "$mode")
    [[ $mode == *+cl* ]] && cl="--channels-last"
    echo "== pytorch $mode ($EPOCHS epochs ${LIMIT:-})"
    python3 bench/pytorch_reference.py --data $DATA --precision "${mode%%+*}" $cl --epochs "$EPOCHS" ${LIMIT:-} \
      --metrics-out "$OUT/reference-pytorch-$name.json" 2>&1 | tee "$OUT/reference-pytorch-$name.log" | grep pytorch
  done
}

step_reference_check() {
  ensure_data
  rm -rf .bench/reference-check && mkdir -p .bench
  python3 tests/bench/pytorch_reference_gpu_check.py build-gpu/ptrain .bench/reference-check "$DATA" 2>&1 \
    | tee "$OUT/reference-check.log" | tail -n 60 || true
  tar -czf "$OUT/reference-check.tgz" --exclude=pytorch-cache --exclude=inductor -C .bench reference-check
}

step_bench() {
  local name=$1
  shift
  ensure_data
  mkdir -p .bench
  ./build-gpu/ptrain bench --out ".bench/$name" "$@" || echo "ptrain bench exit status $?"
  # The PyTorch reference's decoded-image cache stays behind: hundreds of MB, and rebuilt in seconds.
  tar -czf "$OUT/bench-$name.tgz" --exclude=pytorch-cache -C .bench "$name"
}

# multi STRATEGY MODE...: the workload on every GPU of the machine under STRATEGY (dp, ddp, zero1-3, fsdp),
# ptrain then PyTorch's counterpart, each run alone on the GPUs: DataParallel for dp, DDP for ddp,
# ZeroRedundancyOptimizer for zero1, FSDP full-shard for zero3 and fsdp; zero2 has none in PyTorch.
pytorch_counterpart() {
  case $1 in dp|ddp|zero1|fsdp) echo "$1" ;; zero3) echo fsdp ;; *) echo "" ;; esac
}

step_multi() {
  local strategy=$1 gpus mode name
  shift
  ensure_data
  gpus=$(nvidia-smi -L | wc -l)
  for mode in "$@"; do
    name=$strategy-$(file_tag "$mode")
    echo "== ptrain $strategy $mode on $gpus GPUs ($EPOCHS epochs ${LIMIT:-})"
    local train=(train --config configs/cifar10-resnet50-224.yaml $(mode_flags $mode) --strategy "$strategy"
                 --epochs "$EPOCHS" ${LIMIT:-} --progress lines --log-every 100 --metrics-out "$OUT/multi-ptrain-$name.json")
    local limit=(timeout --signal=INT --kill-after=20 "${RUN_TIMEOUT:-100000}")
    if [ "$strategy" = dp ]; then
      "${limit[@]}" ./build-gpu/ptrain "${train[@]}" 2>&1 | tee "$OUT/multi-ptrain-$name.log" | grep -E "^epoch [0-9]+:|result|rror" || echo "(run ended with status $?)"
    else
      "${limit[@]}" ./build-gpu/ptrain launch --nproc-per-node "$gpus" -- ./build-gpu/ptrain "${train[@]}" 2>&1 \
        | tee "$OUT/multi-ptrain-$name.log" | grep -E "rank 0\] (epoch [0-9]+:|result)|rror" || echo "(run ended with status $?)"
    fi
    local theirs
    theirs=$(pytorch_counterpart "$strategy")
    [ -z "${SKIP_PYTORCH:-}" ] || continue
    [ -n "$theirs" ] || { echo "== pytorch: no counterpart of $strategy"; continue; }
    echo "== pytorch $theirs $mode on $gpus GPUs"
    local ref=(bench/pytorch_reference.py --data $DATA --precision "${mode%%+*}" --strategy "$theirs" --log-every 100
               --epochs "$EPOCHS" ${LIMIT:-} --metrics-out "$OUT/multi-pytorch-$name.json")
    if [ "$theirs" = dp ]; then
      "${limit[@]}" python3 "${ref[@]}" 2>&1 | tee "$OUT/multi-pytorch-$name.log" | grep -E "pytorch|rror" || echo "(run ended with status $?)"
    else
      "${limit[@]}" torchrun --standalone --nproc_per_node "$gpus" "${ref[@]}" 2>&1 | tee "$OUT/multi-pytorch-$name.log" | grep -E "pytorch|rror" || echo "(run ended with status $?)"
    fi
  done
}

# dp-probe MODE: PyTorch's DataParallel for 40 logged steps; if it stalls for PROBE_SECONDS (default 90),
# Python's fault handler prints every thread's stack (SIGABRT), to tell a slow run from a stuck one.
step_dp_probe() {
  ensure_data
  PYTHONFAULTHANDLER=1 timeout -s ABRT "${PROBE_SECONDS:-90}" python3 bench/pytorch_reference.py --data $DATA \
    --strategy dp --precision "$1" --max-steps 40 --warmup-epochs 0 --log-every 5 --no-eval \
    --metrics-out "$OUT/dp-probe-$1.json" > "$OUT/dp-probe-$1.log" 2>&1 || echo "(dp probe ended with status $?)"
  grep -E "pytorch|Thread|File" "$OUT/dp-probe-$1.log" | head -n 80 || true
}

# profile NAME FLAGS...: the trace covers PROFILE_STEPS (default 31:33) of a run of at least that many steps.
step_profile() {
  local name=$1
  shift
  ensure_data
  local steps=${PROFILE_STEPS:-31:33}
  ./build-gpu/ptrain train "$@" --profile-out "$OUT/trace-$name.json" --profile-steps "$steps" --progress lines \
    --metrics-out "$OUT/profile-$name.json" > "$OUT/profile-$name.log" 2>&1 || echo "(profile $name ended with status $?)"
  grep -E "CUDA graphs|img/s|rror|trace of" "$OUT/profile-$name.log" | tail -n 6
  python3 -c "import json,sys;r=json.load(open(sys.argv[1]));print('steady', r.get('steady_images_per_second'), 'peak GiB', (r.get('peak_allocated_bytes') or 0)/2**30, 'graphs', r.get('cuda_graphs'), r.get('cuda_graphs_note'), 'kernels', r.get('kernels'), 'phases', r.get('step_phase_seconds'))" "$OUT/profile-$name.json" || true
  if [ -f "$OUT/trace-$name.json" ]; then
    local a=${steps%%:*} b=${steps##*:}
    python3 scripts/trace_summary.py "$OUT/trace-$name.json" --steps $((b - a + 1)) --top 25 > "$OUT/summary-$name.txt" 2>&1 || true
    head -n 30 "$OUT/summary-$name.txt"
    xz -T4 -6 "$OUT/trace-$name.json"
  fi
}

step_kernel_tests() {
  ./build-gpu/tests/kernels/test_kernels 2>&1 | tee "$OUT/kernel-tests.log" | grep -E "^\[  (FAILED|PASSED|SKIPPED) |OK \]|Failure|error|Expected|Which is|rel" | head -n 60
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
while [ $# -gt 0 ]; do
  step=$1; shift
  case $step in
    build) step_build ;;
    keep-binary) step_keep_binary ;;
    prebuilt) step_prebuilt ;;
    diagnose) step_diagnose "$1"; shift ;;
    dp-probe) step_dp_probe "$1"; shift ;;
    test) step_test ;;
    kernel-tests) step_kernel_tests ;;
    profile) step_profile "$@"; break ;;
    smoke) step_smoke "$1"; shift ;;
    reference) step_reference "$@"; break ;;
    multi) step_multi "$@"; break ;;
    bench) step_bench "$@"; break ;;
    reference-check) step_reference_check ;;
    pytorch) step_pytorch "$@"; break ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
