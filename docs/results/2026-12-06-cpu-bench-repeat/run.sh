#!/usr/bin/env bash
# The bench of suite.yaml with --repeat 3 twice: alone, then with load.sh started once its first cell (fp32, rounds
# 1-3: jobs 1-6) is done, so that the second cell (bf16) runs on a busy machine and the first on a quiet one. Both
# benches run at nice -20, so that other work on the machine (at nice 0) takes little of their time; the load runs at
# nice -20 too. From the repository root, after scripts/build.sh:
#   docs/results/2026-12-06-cpu-bench-repeat/run.sh OUT_DIR
set -euo pipefail
here=docs/results/2026-12-06-cpu-bench-repeat
out=${1:?an output directory}
mkdir -p "$out"
bench() {
  nice -n -20 build/ptrain bench --suite $here/suite.yaml --gpus 0 --pytorch --python /usr/bin/python3 --repeat 3 \
    --no-estimate --out "$1"
}
uptime > "$out/alone.uptime"; bench "$out/alone" > "$out/alone.log" 2>&1; uptime >> "$out/alone.uptime"
bench "$out/busy" > "$out/busy.log" 2>&1 & bench_pid=$!
until grep -q '^\[7/12\]' "$out/busy.log" 2>/dev/null; do sleep 1; done
uptime > "$out/busy.uptime"
setsid nice -n -20 bash $here/load.sh & load=$!  # its own process group, all of it stopped below
trap 'kill -- -$load 2>/dev/null' EXIT
wait $bench_pid
uptime >> "$out/busy.uptime"
