#!/usr/bin/env bash
# Fault injection against a built ptrain: kill -9 at random moments during checkpoint writes and
# collectives (also under --max-restarts, which must restart the job to its end), stopped ranks, a killed
# launcher, truncated and bit-flipped checkpoints and data, a full disk, divergence and bad input. Every case ends in a check that nothing was lost (a run resumed after
# the fault ends on the same weights as a run that never saw it, every checkpoint left behind loads) and
# that every failure was named (a non-zero exit and an error naming the file, flag or step; no abort; no
# process left behind). Prints the figures and "N passed, N failed"; exits non-zero on a failure.
#
#   scripts/fault_suite.sh [--short] [--ptrain build/ptrain] [--seed N] [--keep]
#
# --short is the CI version (a few cases of each kind, well under a minute); without it the loops are
# longer. Random moments come from --seed (default: the time), printed so that a failure can be replayed.
set -uo pipefail

cd "$(dirname "$0")/.."
SHORT=0
PTRAIN=build/ptrain
SEED=$(( $(date +%s) % 100000 ))
KEEP=0
while [ $# -gt 0 ]; do
  case "$1" in
    --short) SHORT=1 ;;
    --ptrain) PTRAIN="$2"; shift ;;
    --seed) SEED="$2"; shift ;;
    --keep) KEEP=1 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "fault_suite: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
PTRAIN=$(readlink -f "$PTRAIN")
[ -x "$PTRAIN" ] || { echo "fault_suite: no ptrain executable at $PTRAIN (build it first)" >&2; exit 2; }
PYTHON=$( [ -x /usr/bin/python3 ] && echo /usr/bin/python3 || command -v python3 )  # not a slow pyenv shim
RANDOM=$SEED
ROOT=$(mktemp -d /tmp/ptrain_faults_XXXXXX)
SECONDS=0

# The short run leaves out what costs most: stopped ranks (each waits out --dist-timeout), resuming the
# two-process runs (and so their reference run), and all but a few of the bad inputs (tests/cli has them).
if [ "$SHORT" = 1 ]; then
  SAVE_KILLS=1 RANK_KILLS=1 RESTART_KILLS=1 LAUNCHER_KILLS=1 STOPS=0 FLIPS=100 TRUNCATIONS=20 DATA_FLIPS=2 DDP_RESUMES=0 ALL_BAD_INPUT=0
else
  SAVE_KILLS=20 RANK_KILLS=6 RESTART_KILLS=3 LAUNCHER_KILLS=3 STOPS=3 FLIPS=3000 TRUNCATIONS=200 DATA_FLIPS=40 DDP_RESUMES=1 ALL_BAD_INPUT=1
fi

passed=0 failed=0
cases=0 kills=0 kills_mid_write=0 flipped=0 flips_detected=0 flips_harmless=0 truncated=0 truncations_detected=0
stale_removed=0
pass() { passed=$((passed + 1)); cases=$((cases + 1)); echo "PASS $1 (at ${SECONDS}s)"; }
fail() { failed=$((failed + 1)); cases=$((cases + 1)); echo "FAIL $1: $2 (at ${SECONDS}s)"; }

cleanup() {
  for pid in $(leftovers); do kill -9 "$pid" 2>/dev/null; done
  mountpoint -q "$ROOT/disk" 2>/dev/null && umount "$ROOT/disk"
  mountpoint -q "$ROOT/logdisk" 2>/dev/null && umount "$ROOT/logdisk"
  [ "$KEEP" = 1 ] || rm -rf "$ROOT"
}
trap cleanup EXIT

# Processes of this suite's runs still alive: every run's command line names a path under ROOT.
leftovers() { pgrep -f -- "$ROOT/" | grep -vx "$$" || true; }
no_leftovers() {  # waits up to $1 seconds for every process of the suite's runs to be gone
  local deadline=$(( $(date +%s) + ${1:-5} ))
  while [ -n "$(leftovers)" ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.1; done
  [ -z "$(leftovers)" ]
}
random_between() { echo $(( $1 + RANDOM % ($2 - $1 + 1) )); }  # integers
sleep_ms() { sleep "$(printf '%d.%03d' $(( $1 / 1000 )) $(( $1 % 1000 )))"; }

# The weights digest `ptrain verify` prints for a checkpoint; empty when it does not verify.
digest_of() { "$PTRAIN" verify "$1" 2>/dev/null | sed -n 's/.*: ok, .*weights \(crc32:[0-9a-f]*\)$/\1/p'; }
latest_in() { ls "$1"/step-*.safetensors 2>/dev/null | grep -v '\.rank-' | sort | tail -1; }
temporaries_in() { ls "$1"/*.tmp.* 2>/dev/null | wc -l; }
# Every checkpoint in a directory loads (and holds only finite values).
all_verify() {
  local files
  files=$(ls "$1"/step-*.safetensors 2>/dev/null | grep -v '\.rank-')
  [ -z "$files" ] && return 0
  # shellcheck disable=SC2086
  "$PTRAIN" verify $files > "$1.verify" 2>&1
}

# 16 steps an epoch of resnet20 on 8x8 images: a few seconds for 3 epochs on one thread.
BASE=(train --model resnet20 --dataset synthetic --data-path 256:3x8x8:4 --device cpu --threads 1 --progress none
      --test-limit 32 --schedule constant --warmup-epochs 0 --log-every 4)
TINY=("${BASE[@]}" --batch-size 16)
SINGLE=("${TINY[@]}" --seed 5 --lr 0.05 --epochs 3 --checkpoint-every 1)
# Two processes of 8 samples each: 16 steps an epoch. Each run adds its --dist-timeout.
DDP=("${BASE[@]}" --batch-size 8 --seed 5 --lr 0.05 --epochs 2 --checkpoint-every 2 --strategy ddp)
port=$(( 20000 + RANDOM % 8000 ))  # below the ephemeral range, where other tests pick theirs
next_port() { port=$(( port + 1 )); echo "$port"; }
launch() { "$PTRAIN" launch --nproc-per-node 2 --master-port "$(next_port)" --timeout 300 -- "$PTRAIN" "$@"; }

echo "fault suite: seed $SEED, $([ "$SHORT" = 1 ] && echo short || echo full) run, scratch $ROOT"

# --- references: the runs that see no fault -------------------------------------------------------
# How long a run lasts here: kills are timed inside it (a kill after it ended would test nothing).
started_ms=$(date +%s%3N)
"$PTRAIN" "${SINGLE[@]}" --checkpoint-dir "$ROOT/ref" > "$ROOT/ref.log" 2>&1
SINGLE_MS=$(( $(date +%s%3N) - started_ms ))
echo "reference runs: single done at ${SECONDS}s (${SINGLE_MS} ms)"
REF=$(digest_of "$(latest_in "$ROOT/ref")")
DDP_REF=none
if [ "$DDP_RESUMES" = 1 ]; then
  launch "${DDP[@]}" --dist-timeout 20 --checkpoint-dir "$ROOT/ddp-ref" > "$ROOT/ddp-ref.log" 2>&1
  DDP_REF=$(digest_of "$(latest_in "$ROOT/ddp-ref")")
fi
if [ -z "$REF" ] || [ -z "$DDP_REF" ]; then
  echo "fault suite: the reference runs failed (see $ROOT/ref.log, $ROOT/ddp-ref.log)"
  KEEP=1
  exit 1
fi

# Resumes a run in $1 (single or ddp) until it is done and checks that it ends on the reference's weights
# and that no temporary file is left.
resume_and_compare() {
  local dir=$1 kind=$2 name=$3 log=$1.resume.log
  if [ "$kind" = ddp ] && [ "$DDP_RESUMES" = 0 ]; then pass "${name/(resumed)/(named, nothing left; resumed in the full run)}"; return; fi
  local resume=() rc=0
  [ -n "$(latest_in "$dir")" ] && resume=(--resume latest)
  # A run the fault missed (it had ended) left its last step: nothing to resume, and ptrain refuses that.
  local last=$ROOT/ref
  [ "$kind" = single ] || last=$ROOT/ddp-ref
  if [ "$(basename "$(latest_in "$dir")")" = "$(basename "$(latest_in "$last")")" ]; then :
  elif [ "$kind" = single ]; then
    "$PTRAIN" "${SINGLE[@]}" --checkpoint-dir "$dir" "${resume[@]}" > "$log" 2>&1; rc=$?
  else
    launch "${DDP[@]}" --dist-timeout 20 --checkpoint-dir "$dir" "${resume[@]}" > "$log" 2>&1; rc=$?
  fi
  local want=$REF
  [ "$kind" = single ] || want=$DDP_REF
  local got
  got=$(digest_of "$(latest_in "$dir")")
  if [ $rc -ne 0 ]; then fail "$name" "the resumed run failed ($rc): $(grep -m1 'error' "$log")"; return; fi
  if [ "$got" != "$want" ]; then fail "$name" "resumed to weights $got, the uninterrupted run has $want"; return; fi
  if [ "$(temporaries_in "$dir")" -ne 0 ]; then fail "$name" "temporary files left after the resume"; return; fi
  pass "$name"
}

# --- kill -9 during checkpoint writes (one process, a checkpoint every step) -----------------------
for i in $(seq 1 "$SAVE_KILLS"); do
  dir=$ROOT/save-kill-$i
  "$PTRAIN" "${SINGLE[@]}" --checkpoint-dir "$dir" > "$dir.log" 2>&1 &
  pid=$!
  sleep_ms "$(random_between $((SINGLE_MS / 5)) $((SINGLE_MS * 9 / 10)))"
  if [ $((i % 2)) -eq 1 ]; then
    # Every other kill waits for a write in progress (its temporary file) and lands inside it.
    for _ in $(seq 1 2000); do
      compgen -G "$dir/*.tmp.*" > /dev/null && break
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.002
    done
  fi
  if kill -9 "$pid" 2>/dev/null; then
    kills=$((kills + 1))
    wait "$pid" 2>/dev/null
    left=$(temporaries_in "$dir")
    [ "$left" -gt 0 ] && kills_mid_write=$((kills_mid_write + 1)) && stale_removed=$((stale_removed + left))
  else
    wait "$pid" 2>/dev/null
  fi
  if ! all_verify "$dir"; then fail "kill -9 during saves #$i" "a checkpoint left behind does not load: $(grep -m1 error "$dir.verify")"; continue; fi
  resume_and_compare "$dir" single "kill -9 during saves #$i (resumed)"
done

# --- kill -9 of one rank during training (collectives, and rank 0's checkpoint writes) -------------
for i in $(seq 1 "$RANK_KILLS"); do
  dir=$ROOT/rank-kill-$i
  launch "${DDP[@]}" --dist-timeout 20 --checkpoint-dir "$dir" > "$dir.log" 2>&1 &
  launcher=$!
  sleep_ms "$(random_between 2500 6000)"
  ranks=($(pgrep -P "$launcher"))
  if [ ${#ranks[@]} -eq 2 ]; then
    victim=${ranks[$((RANDOM % 2))]}
    kill -9 "$victim" 2>/dev/null && kills=$((kills + 1))
    began=$(date +%s)
    wait "$launcher"
    rc=$?
    took=$(( $(date +%s) - began ))
    if [ $rc -eq 0 ]; then fail "kill -9 of a rank #$i" "launch exited 0"; continue; fi
    if ! grep -q "ptrain launch: rank [01] (pid [0-9]*) exited with code" "$dir.log"; then
      fail "kill -9 of a rank #$i" "launch did not name the failed rank: $(tail -2 "$dir.log")"; continue
    fi
    if [ "$took" -gt 40 ]; then fail "kill -9 of a rank #$i" "the job took ${took}s to end"; continue; fi
  else
    wait "$launcher"  # finished before the kill
  fi
  if ! no_leftovers 5; then fail "kill -9 of a rank #$i" "processes left: $(leftovers | tr '\n' ' ')"; continue; fi
  if ! all_verify "$dir"; then fail "kill -9 of a rank #$i" "a checkpoint does not load: $(grep -m1 error "$dir.verify")"; continue; fi
  resume_and_compare "$dir" ddp "kill -9 of a rank #$i (resumed)"
done

# --- kill -9 of one rank under --max-restarts: the job restarts itself from its newest checkpoint ----
for i in $(seq 1 "$RESTART_KILLS"); do
  dir=$ROOT/restart-kill-$i
  "$PTRAIN" launch --nproc-per-node 2 --max-restarts 2 --timeout 300 -- "$PTRAIN" "${DDP[@]}" --dist-timeout 20 \
    --checkpoint-dir "$dir" > "$dir.log" 2>&1 &
  launcher=$!
  # Timed from the first checkpoint, so that the kill lands inside the run and the restart resumes one.
  while [ -z "$(latest_in "$dir")" ] && kill -0 "$launcher" 2>/dev/null; do sleep 0.02; done
  sleep_ms "$(random_between 0 800)"
  ranks=($(pgrep -P "$launcher"))
  killed=0
  if [ ${#ranks[@]} -eq 2 ]; then
    victim=${ranks[$((RANDOM % 2))]}
    kill -9 "$victim" 2>/dev/null && kills=$((kills + 1)) && killed=1
  fi
  wait "$launcher"
  rc=$?
  name="kill -9 of a rank under --max-restarts #$i"
  if [ $rc -ne 0 ]; then fail "$name" "the job did not restart to its end ($rc): $(grep -m1 'error\|ptrain launch:' "$dir.log")"; continue; fi
  # Ended 0, a job whose rank the kill reached restarted; a kill that came as the rank was exiting 0 left
  # nothing to restart. Where the launcher restarted, rank 0 must say where the job resumed.
  if [ "$killed" = 1 ] && grep -q "ptrain launch: restart 1 of 2: rank [01] exited with signal 9 (SIGKILL)" "$dir.log" &&
     ! grep -q "\[rank 0\] ptrain: restart 1 of the job (rank [01] exited with signal 9 (SIGKILL)): " "$dir.log"; then
    fail "$name" "rank 0 did not say where the restarted job resumed"; continue
  fi
  if ! no_leftovers 5; then fail "$name" "processes left: $(leftovers | tr '\n' ' ')"; continue; fi
  if ! all_verify "$dir"; then fail "$name" "a checkpoint does not load: $(grep -m1 error "$dir.verify")"; continue; fi
  if [ "$DDP_RESUMES" = 1 ] && [ "$(digest_of "$(latest_in "$dir")")" != "$DDP_REF" ]; then
    fail "$name" "ended on weights $(digest_of "$(latest_in "$dir")"), the uninterrupted run has $DDP_REF"; continue
  fi
  pass "$name"
done

# --- kill -9 of ptrain launch itself: its ranks must die with it -----------------------------------
for i in $(seq 1 "$LAUNCHER_KILLS"); do
  dir=$ROOT/launcher-kill-$i
  "$PTRAIN" launch --nproc-per-node 2 --master-port "$(next_port)" -- "$PTRAIN" "${DDP[@]}" --dist-timeout 20 --checkpoint-dir "$dir" \
    > "$dir.log" 2>&1 &
  launcher=$!
  sleep_ms "$(random_between 2500 6000)"
  kill -9 "$launcher" 2>/dev/null && kills=$((kills + 1))
  wait "$launcher" 2>/dev/null
  if ! no_leftovers 5; then fail "kill -9 of the launcher #$i" "ranks outlived it: $(leftovers | tr '\n' ' ')"; continue; fi
  if ! all_verify "$dir"; then fail "kill -9 of the launcher #$i" "a checkpoint does not load"; continue; fi
  resume_and_compare "$dir" ddp "kill -9 of the launcher #$i (resumed)"
done

# --- a stopped rank (SIGSTOP): the other one must give up within --dist-timeout ---------------------
for i in $(seq 1 "$STOPS"); do
  dir=$ROOT/stop-$i
  launch "${DDP[@]}" --dist-timeout 4 --checkpoint-dir "$dir" > "$dir.log" 2>&1 &
  launcher=$!
  sleep_ms "$(random_between 3000 6000)"
  ranks=($(pgrep -P "$launcher"))
  if [ ${#ranks[@]} -eq 2 ]; then
    kill -STOP "${ranks[$((RANDOM % 2))]}"
    began=$(date +%s)
    wait "$launcher"
    rc=$?
    took=$(( $(date +%s) - began ))
    if [ $rc -eq 0 ]; then fail "stopped rank #$i" "launch exited 0"; continue; fi
    if [ "$took" -gt 30 ]; then fail "stopped rank #$i" "the job took ${took}s to end (--dist-timeout 4)"; continue; fi
    if ! grep -qi "timed out\|timeout\|exited with code" "$dir.log"; then
      fail "stopped rank #$i" "no rank named the timeout: $(tail -3 "$dir.log")"; continue
    fi
  else
    wait "$launcher"
  fi
  if ! no_leftovers 10; then fail "stopped rank #$i" "processes left: $(leftovers | tr '\n' ' ')"; continue; fi
  resume_and_compare "$dir" ddp "stopped rank #$i (resumed)"
done

# --- flipped bits and truncations of checkpoints ---------------------------------------------------
# Every damaged copy must be refused naming its file, or (a flip that changes nothing loaded) load to the
# same weights. A sample of them also goes through a real --resume, which must fail naming the file.
source_ckpt=$(latest_in "$ROOT/ref")
mkdir -p "$ROOT/flips"
batch=$([ "$SHORT" = 1 ] && echo $((FLIPS + TRUNCATIONS)) || echo 100)
made=0
while [ "$made" -lt "$((FLIPS + TRUNCATIONS))" ]; do
  rm -f "$ROOT"/flips/*
  count=$(( FLIPS + TRUNCATIONS - made < batch ? FLIPS + TRUNCATIONS - made : batch ))
  "$PYTHON" - "$source_ckpt" "$ROOT/flips" "$count" "$made" "$FLIPS" "$RANDOM" <<'EOF'
import os, random, sys
source, out, count, first, flips, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
data = open(source, "rb").read()
rng = random.Random(seed)
for n in range(first, first + count):
    if n < flips:
        at = rng.randrange(len(data))
        damaged = bytearray(data)
        damaged[at] ^= 1 << rng.randrange(8)
        name = f"flip-{n}-at-{at}"
    else:
        cut = rng.randrange(len(data))
        damaged = data[:cut]
        name = f"cut-{n}-at-{cut}"
    with open(os.path.join(out, name + ".safetensors"), "wb") as f:
        f.write(damaged)
EOF
  made=$((made + count))
  "$PTRAIN" verify "$ROOT"/flips/*.safetensors > "$ROOT/flips.out" 2>&1
  want=$(digest_of "$source_ckpt")
  while IFS= read -r line; do
    file=${line%%: *}
    case "$file" in
      */flip-*) flipped=$((flipped + 1)) ;;
      */cut-*) truncated=$((truncated + 1)) ;;
      *) continue ;;
    esac
    if [[ "$line" == *": error: "* ]]; then
      case "$file" in */flip-*) flips_detected=$((flips_detected + 1)) ;; *) truncations_detected=$((truncations_detected + 1)) ;; esac
    elif [[ "$line" == *"weights $want" && "$file" == */flip-* ]]; then
      flips_harmless=$((flips_harmless + 1))
    else
      fail "damaged checkpoint" "accepted with other contents: $line"
    fi
  done < "$ROOT/flips.out"
  # One damaged copy of the batch through a real resume: one error line naming it.
  sample=$(ls "$ROOT"/flips/*.safetensors | sed -n "$(random_between 1 "$count")p")
  if grep -q "^$sample: error" "$ROOT/flips.out"; then
    "$PTRAIN" "${TINY[@]}" --seed 5 --lr 0.05 --epochs 3 --resume "$sample" > "$ROOT/flips.resume" 2>&1
    rc=$?
    if [ $rc -ne 2 ] || ! grep -q "ptrain: error: .*$sample" "$ROOT/flips.resume"; then
      fail "damaged checkpoint resume" "$sample: exit $rc, $(tail -1 "$ROOT/flips.resume")"
    fi
  fi
done
if [ "$flips_detected" -gt 0 ] && [ "$truncations_detected" -eq "$truncated" ] && [ "$flipped" -gt 0 ]; then
  pass "checkpoint damage: $flipped flips ($flips_detected refused, $flips_harmless harmless), $truncated truncations (all refused)"
else
  fail "checkpoint damage" "$flipped flips ($flips_detected refused, $flips_harmless harmless), $truncated truncations ($truncations_detected refused)"
fi

# --- flipped bits and truncations of data (gzipped IDX: zlib's CRC covers the content) --------------
mkdir -p "$ROOT/data"
"$PYTHON" - /usr/share/datasets/fashion-mnist "$ROOT/data/clean" <<'EOF'
import gzip, os, struct, sys
source, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
for split, n in (("train", 256), ("t10k", 64)):
    images = gzip.open(f"{source}/{split}-images-idx3-ubyte.gz").read(16 + n * 784)
    labels = gzip.open(f"{source}/{split}-labels-idx1-ubyte.gz").read(8 + n)
    with gzip.open(f"{out}/{split}-images-idx3-ubyte.gz", "wb") as f:
        f.write(struct.pack(">IIII", 2051, n, 28, 28) + images[16:16 + n * 784])
    with gzip.open(f"{out}/{split}-labels-idx1-ubyte.gz", "wb") as f:
        f.write(struct.pack(">II", 2049, n) + labels[8:8 + n])
EOF
data_ok=1
for i in $(seq 1 "$DATA_FLIPS"); do
  dir=$ROOT/data/d$i
  rm -rf "$dir"
  cp -r "$ROOT/data/clean" "$dir"
  files=("$dir"/*.gz)
  victim=${files[$((RANDOM % ${#files[@]}))]}
  how=$([ $((i % 4)) -eq 0 ] && echo cut || echo flip)
  "$PYTHON" - "$victim" "$how" "$RANDOM" <<'EOF'
import random, sys
path, how, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
data = bytearray(open(path, "rb").read())
rng = random.Random(seed)
if how == "cut":
    data = data[:rng.randrange(len(data))]
else:
    data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
open(path, "wb").write(data)
EOF
  [ "$how" = cut ] && truncated=$((truncated + 1)) || flipped=$((flipped + 1))
  "$PTRAIN" train --model resnet20 --dataset mnist --data-path "$dir" --batch-size 16 --max-steps 1 --device cpu \
    --threads 1 --progress none > "$dir.log" 2>&1
  rc=$?
  same=$("$PYTHON" -c "import gzip,sys
try: print(int(gzip.open(sys.argv[1]).read() == gzip.open(sys.argv[2]).read()))
except Exception: print(0)" "$victim" "$ROOT/data/clean/$(basename "$victim")")
  if [ $rc -eq 0 ] && [ "$same" = 1 ]; then
    [ "$how" = flip ] && flips_harmless=$((flips_harmless + 1))
  elif [ $rc -ne 0 ] && grep -q "ptrain: error: $victim" "$dir.log"; then
    [ "$how" = flip ] && flips_detected=$((flips_detected + 1)) || truncations_detected=$((truncations_detected + 1))
  else
    data_ok=0
    fail "damaged data #$i" "$how of $victim: exit $rc, $(grep -m1 -i 'error\|result' "$dir.log")"
  fi
done
[ "$data_ok" = 1 ] && pass "damaged data: $DATA_FLIPS flipped or cut IDX files refused by name or harmless"

# --- a full disk ---------------------------------------------------------------------------------
# A 5 MiB tmpfs holds two checkpoints of 2.2 MB; where mounting is not allowed, ulimit -f makes writes past
# 5 MiB fail the same way (with EFBIG instead of ENOSPC).
mkdir -p "$ROOT/disk"
if mount -t tmpfs -o size=5m tmpfs "$ROOT/disk" 2>/dev/null; then
  disk_how="a 5 MiB tmpfs"
  full_run() { "$PTRAIN" "$@"; }
else
  disk_how="ulimit -f 5120 (no mount allowed)"
  full_run() { (trap '' XFSZ; ulimit -f 5120; exec "$PTRAIN" "$@"); }
fi
full_run "${SINGLE[@]}" --checkpoint-dir "$ROOT/disk/full" > "$ROOT/disk.log" 2>&1
rc=$?
if [ $rc -eq 0 ]; then
  fail "full disk ($disk_how)" "the run exited 0"
elif ! grep -q "ptrain: error: cannot write $ROOT/disk/full/step-.*\(No space left\|File too large\)" "$ROOT/disk.log"; then
  fail "full disk ($disk_how)" "not named: $(grep -m1 error "$ROOT/disk.log")"
elif [ "$(temporaries_in "$ROOT/disk/full")" -ne 0 ]; then
  fail "full disk ($disk_how)" "temporary files left on the full disk"
elif ! all_verify "$ROOT/disk/full"; then
  fail "full disk ($disk_how)" "a checkpoint on the full disk does not load"
else
  # Nothing lost: the newest checkpoint that fit resumes elsewhere to the reference's end.
  mkdir -p "$ROOT/disk-resumed"
  cp "$(latest_in "$ROOT/disk/full")" "$ROOT/disk-resumed/"
  resume_and_compare "$ROOT/disk-resumed" single "full disk ($disk_how): named, and its last checkpoint resumes"
fi
rm -rf "$ROOT/disk/full"
if [ "$SHORT" = 0 ]; then
  full_run "${SINGLE[@]}" --keep-checkpoints 1 --checkpoint-dir "$ROOT/disk/kept" > "$ROOT/disk-kept.log" 2>&1
  if [ $? -eq 0 ] && [ "$(digest_of "$(latest_in "$ROOT/disk/kept")")" = "$REF" ] &&
     [ "$(ls "$ROOT"/disk/kept/step-*.safetensors | wc -l)" -eq 1 ]; then
    pass "full disk ($disk_how): --keep-checkpoints 1 fits and ends on the reference's weights"
  else
    fail "full disk ($disk_how): --keep-checkpoints 1" "$(grep -m1 error "$ROOT/disk-kept.log")"
  fi
fi
mountpoint -q "$ROOT/disk" && umount "$ROOT/disk"

# --- divergence ----------------------------------------------------------------------------------
"$PTRAIN" "${TINY[@]}" --epochs 2 --lr 1e6 --checkpoint-every 1 --checkpoint-dir "$ROOT/diverged" > "$ROOT/diverged.log" 2>&1
rc=$?
if [ $rc -ne 2 ] || ! grep -q "ptrain: error: training diverged at step [0-9]" "$ROOT/diverged.log"; then
  fail "divergence" "exit $rc: $(grep -m1 -i 'error\|result' "$ROOT/diverged.log")"
elif ! all_verify "$ROOT/diverged"; then
  fail "divergence" "a non-finite checkpoint was saved: $(grep -m1 error "$ROOT/diverged.verify")"
else
  pass "divergence: stopped naming the step, every checkpoint finite"
fi

# --- bad input: one error line naming the thing, a non-zero exit, never an abort --------------------
bad_input() {  # name, text the output must hold, ptrain arguments...
  local name=$1 want=$2
  shift 2
  local out rc
  out=$("$PTRAIN" "$@" 2>&1)
  rc=$?
  if [ $rc -eq 0 ] || [ $rc -ge 128 ]; then fail "bad input: $name" "exit $rc"
  elif [[ "$out" != *"$want"* ]]; then fail "bad input: $name" "does not name '$want': $(echo "$out" | tail -2)"
  elif [[ "$out" == *"terminate called"* ]]; then fail "bad input: $name" "aborted"
  else pass "bad input: $name"
  fi
}
mkdir -p "$ROOT/bad"
echo x > "$ROOT/bad/file"
printf 'epochs: 2\nlr: 0.1\nepochs: 3\n' > "$ROOT/bad/twice.yaml"
echo x > "$ROOT/bad/step-99999999999999999999999.safetensors"
bad_input "--lr nan" "--lr" "${TINY[@]}" --lr nan
if [ "$ALL_BAD_INPUT" = 1 ]; then
bad_input "--momentum nan" "--momentum" "${TINY[@]}" --momentum nan
bad_input "--epochs overflow" "--epochs" "${TINY[@]}" --epochs 9223372036854775807
bad_input "--seed -1" "--seed" "${TINY[@]}" --seed -1
bad_input "duplicate YAML key" "'epochs' is given twice" "${TINY[@]}" --config "$ROOT/bad/twice.yaml"
bad_input "--checkpoint-dir is a file" "$ROOT/bad/file" "${TINY[@]}" --checkpoint-dir "$ROOT/bad/file"
fi
bad_input "--metrics-out under a file" "$ROOT/bad/file" "${TINY[@]}" --metrics-out "$ROOT/bad/file/m.json"
[ "$ALL_BAD_INPUT" = 1 ] && bad_input "absurd checkpoint step" "step-99999999999999999999999" "${TINY[@]}" --checkpoint-dir "$ROOT/bad" --resume latest
if [ "$ALL_BAD_INPUT" = 1 ]; then
bad_input "--bucket-cap-mb under zero2" "--bucket-cap-mb" "${TINY[@]}" --strategy zero2 --bucket-cap-mb 50 --dry-run
bad_input "a checkpoint as --weights" "--resume" "${TINY[@]}" --weights "$source_ckpt" --max-steps 1
fi
if mkdir -p "$ROOT/ro" && mount -t tmpfs -o ro,size=1m tmpfs "$ROOT/ro" 2>/dev/null; then
  bad_input "read-only --checkpoint-dir" "$ROOT/ro" "${TINY[@]}" --checkpoint-dir "$ROOT/ro/ckpt"
  umount "$ROOT/ro"
fi

# Numbers LibTorch narrows to float, settings without effect and plans train refuses: --dry-run refuses
# them too; a config file of two documents or a directory, an empty test split; a link at --metrics-out.
plans_and_messages() {
  local dir="$ROOT/plans"
  mkdir -p "$dir"
  # TINY's schedule is constant; these cases need the default, cosine.
  local cosine=(train --model resnet20 --dataset synthetic --data-path 256:3x8x8:4 --device cpu --threads 1
                --progress none --batch-size 16 --warmup-epochs 0)
  bad_input "--lr 1e39 (dry run)" "--lr" "${TINY[@]}" --lr 1e39 --dry-run
  PTRAIN_WEIGHT_DECAY=1e39 bad_input "PTRAIN_WEIGHT_DECAY=1e39" "--weight-decay" "${TINY[@]}" --dry-run
  bad_input "--momentum with adamw (dry run)" "--momentum applies to --optimizer sgd" "${TINY[@]}" --optimizer adamw \
    --momentum 0.5 --dry-run
  bad_input "--min-lr above --lr (dry run)" "--min-lr 0.5 must not exceed --lr 0.1" "${cosine[@]}" --lr 0.1 --min-lr 0.5 \
    --dry-run
  printf 'epochs: 2\n---\nlr: 0.5\n' > "$dir/two.yaml"
  bad_input "a second YAML document" "$dir/two.yaml: holds a second YAML document" "${TINY[@]}" --config "$dir/two.yaml"
  [ "$ALL_BAD_INPUT" = 1 ] || return 0
  bad_input "--config DIR" "$dir: is a directory" "${TINY[@]}" --config "$dir"
  bad_input "--eps with sgd (dry run)" "--eps applies to --optimizer adamw" "${TINY[@]}" --eps 1e-6 --dry-run
  bad_input "--gamma with cosine (dry run)" "--gamma applies to --schedule step" "${cosine[@]}" --gamma 0.5 --dry-run
  mkdir -p "$dir/cifar"
  for i in 1 2 3 4 5; do head -c $((3073 * 16)) /dev/zero > "$dir/cifar/data_batch_$i.bin"; done
  : > "$dir/cifar/test_batch.bin"
  bad_input "an empty test split" "$dir/cifar/test_batch.bin" train --model resnet20 --dataset cifar10 \
    --data-path "$dir/cifar" --device cpu --threads 1 --batch-size 16 --max-steps 1 --progress none
  mkdir -p "$dir/results"
  echo '{}' > "$dir/results/run.json"
  ln -sf results/run.json "$dir/latest.json"
  if ! "$PTRAIN" "${TINY[@]}" --max-steps 1 --metrics-out "$dir/latest.json" > "$dir/link.out" 2>&1; then
    fail "a link at --metrics-out" "exit non-zero: $(tail -1 "$dir/link.out")"
  elif [ ! -L "$dir/latest.json" ] || ! grep -q '"steps"' "$dir/results/run.json"; then
    fail "a link at --metrics-out" "the link was replaced or its target not written"
  else
    pass "a link at --metrics-out"
  fi
}
plans_and_messages
# --- numbers and image headers ---------------------------------------------------------------------
# Zero-padded numbers are decimal (CLI11 and yaml-cpp read 010 as octal eight and refused 09), other bases are
# refused by name; a 159-byte JPEG whose header claims 30000x30000 or 65500x65500 pixels is refused naming the
# file and the bound, from its header (it took 2.8 GB, or died of std::bad_alloc naming no file).
numbers_and_image_headers() {
  local dir="$ROOT/numbers" out
  mkdir -p "$dir"
  out=$("$PTRAIN" "${BASE[@]}" --batch-size 010 --dry-run 2>&1)
  if [[ "$out" == *"batch 10 per device"* ]]; then pass "--batch-size 010 is ten"
  else fail "--batch-size 010 is ten" "$(echo "$out" | grep -m1 'batch\|error')"; fi
  bad_input "--batch-size 0x20" "--batch-size: '0x20' is not a decimal number" "${BASE[@]}" --batch-size 0x20 --dry-run
  local sizes="30000" loadings="memory stream"
  if [ "$ALL_BAD_INPUT" = 1 ]; then
    sizes="30000 65500" loadings="auto memory stream"
    out=$(PTRAIN_BATCH_SIZE=09 "$PTRAIN" "${BASE[@]}" --dry-run 2>&1)
    if [[ "$out" == *"batch 9 per device"* ]]; then pass "PTRAIN_BATCH_SIZE=09 is nine"
    else fail "PTRAIN_BATCH_SIZE=09 is nine" "$(echo "$out" | grep -m1 'batch\|error')"; fi
    PTRAIN_SEED=0x10 bad_input "PTRAIN_SEED=0x10" "PTRAIN_SEED=0x10: '0x10' is not a decimal number" "${TINY[@]}" --dry-run
    printf 'epochs: 0x3\n' > "$dir/hex.yaml"
    bad_input "epochs: 0x3 in a --config file" "$dir/hex.yaml: key 'epochs'" "${TINY[@]}" --config "$dir/hex.yaml" --dry-run
  fi
  # An 8x8 grey JPEG (libjpeg, quality 50); its SOF0 frame's height and width are the bytes at 94..97.
  local jpeg=/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDABALDA4MChAODQ4SERATGCgaGBYWGDEjJR0oOjM9PDkzODdASFxOQERXRTc4UG1RV19iZ2hnPk1xeXBkeFxlZ2P/wAALCAAIAAgBAREA/8QAFAABAAAAAAAAAAAAAAAAAAAAAP/EABQQAQAAAAAAAAAAAAAAAAAAAAD/2gAIAQEAAD8AP//Z
  local size split loading peak
  for size in $sizes; do
    for split in train test; do
      mkdir -p "$dir/bomb-$size/$split/a"
      echo "$jpeg" | base64 -d | "$PYTHON" -c "import sys; d = bytearray(sys.stdin.buffer.read()); \
        d[94:98] = ($size).to_bytes(2, 'big') * 2; sys.stdout.buffer.write(d)" > "$dir/bomb-$size/$split/a/bomb.jpg"
    done
    for loading in $loadings; do
      bad_input "a JPEG header of ${size}x${size} (--image-loading $loading)" \
        "$dir/bomb-$size/train/a/bomb.jpg: its header says ${size}x${size} pixels" train --model resnet20 \
        --dataset imagefolder --data-path "$dir/bomb-$size" --image-loading "$loading" --image-size 8 --device cpu \
        --threads 1 --batch-size 1 --max-steps 1 --progress none
    done
  done
  if [ -x /usr/bin/time ]; then  # refused before its 2.5 GiB of pixels are allocated
    /usr/bin/time -f '%M' -o "$dir/rss" "$PTRAIN" train --model resnet20 --dataset imagefolder --image-loading memory \
      --data-path "$dir/bomb-30000" --device cpu --threads 1 --batch-size 1 --max-steps 1 --progress none > /dev/null 2>&1
    peak=$(tail -1 "$dir/rss")
    if [ "${peak:-0}" -lt 1048576 ]; then pass "a JPEG header of 30000x30000: peak RSS $((peak / 1024)) MiB"
    else fail "a JPEG header of 30000x30000" "peak RSS $((peak / 1024)) MiB"; fi
  fi
}
numbers_and_image_headers

# --- outputs: devices, streams and FIFOs written in place; outputs on one file; a full disk under the logs --
# A device or stream at an output was renamed over (/dev/null replaced by a file, as root; the log of
# `> log` replaced by the record), two outputs on one file left one of them, and a full disk under the logs
# stopped the run with nothing saved.
outputs() {
  local dir="$ROOT/outputs" rc
  mkdir -p "$dir"
  "$PTRAIN" "${TINY[@]}" --max-steps 4 --metrics-out /dev/stdout --log-jsonl /dev/stdout > "$dir/log" 2>&1
  rc=$?
  if [ $rc -ne 0 ]; then fail "--metrics-out /dev/stdout > log" "exit $rc: $(grep -m1 error "$dir/log")"
  elif ! grep -q '^result:' "$dir/log" || ! grep -q '"kind":"step","step":4,' "$dir/log" || ! grep -q '"steps": 4' "$dir/log"; then
    fail "--metrics-out /dev/stdout > log" "the log lost its lines or the record: $(head -c 300 "$dir/log")"
  else pass "--metrics-out and --log-jsonl /dev/stdout > log: appended after the run's lines"
  fi
  "$PTRAIN" "${TINY[@]}" --max-steps 1 --metrics-out /dev/stdout 2>&1 | cat > "$dir/piped"
  rc=${PIPESTATUS[0]}
  if [ $rc -ne 0 ] || ! grep -q '"steps": 1' "$dir/piped"; then fail "--metrics-out /dev/stdout | cat" "exit $rc: $(tail -1 "$dir/piped")"
  else pass "--metrics-out /dev/stdout | cat: the record goes through the pipe"
  fi
  mkfifo "$dir/fifo"
  cat "$dir/fifo" > "$dir/fifo.read" &
  local reader=$!
  "$PTRAIN" "${TINY[@]}" --max-steps 1 --metrics-out "$dir/fifo" > "$dir/fifo.log" 2>&1
  rc=$?
  wait "$reader"
  if [ $rc -ne 0 ] || [ ! -p "$dir/fifo" ] || ! grep -q '"steps": 1' "$dir/fifo.read"; then
    fail "--metrics-out FIFO" "exit $rc, a FIFO still: $([ -p "$dir/fifo" ] && echo yes || echo no)"
  else pass "--metrics-out FIFO: its reader gets the record, the FIFO stays"
  fi
  "$PTRAIN" "${TINY[@]}" --max-steps 1 --metrics-out /dev/null --log-jsonl /dev/null > "$dir/null.log" 2>&1
  rc=$?
  if [ $rc -ne 0 ] || [ ! -c /dev/null ]; then fail "--metrics-out /dev/null" "exit $rc, a device still: $([ -c /dev/null ] && echo yes || echo no)"
  else pass "--metrics-out and --log-jsonl /dev/null: the device stays a device"
  fi
  "$PTRAIN" "${TINY[@]}" --max-steps 1 --metrics-out /dev/full > "$dir/full.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ] || [ ! -c /dev/full ] || ! grep -q "ptrain: error: cannot write /dev/full: No space left on device" "$dir/full.log"; then
    fail "--metrics-out /dev/full" "exit $rc: $(grep -m1 error "$dir/full.log")"
  else pass "--metrics-out /dev/full: named with ENOSPC, the device stays a device"
  fi
  bad_input "--save-weights and --metrics-out on one file" "are one file" "${TINY[@]}" --max-steps 1 \
    --save-weights "$dir/x.pt" --metrics-out "$dir/x.pt"
  bad_input "--save-weights inside --checkpoint-dir" "lies inside --checkpoint-dir" "${TINY[@]}" --max-steps 1 \
    --checkpoint-dir "$dir/ck" --save-weights "$dir/ck/step-00000001.safetensors"
  bad_input "--log-jsonl and --metrics-out on one file (spelled otherwise)" "are one file" "${TINY[@]}" --max-steps 1 \
    --log-jsonl "$dir/run.json" --metrics-out "$dir/../outputs/run.json"
  if [ -e "$dir/x.pt" ] || [ -e "$dir/run.json" ]; then fail "colliding outputs" "a refused run wrote its outputs"; fi
  # A full disk under the logs: /dev/full (every write ENOSPC), and where mounting is allowed, a tmpfs with one
  # page left, which the event file fills mid-run. The run trains on and saves everything else.
  local log_disks=(/dev/full)
  mkdir -p "$ROOT/logdisk"
  if mount -t tmpfs -o size=5m tmpfs "$ROOT/logdisk" 2>/dev/null; then
    head -c $(( 5 * 1024 * 1024 - 4096 )) /dev/zero > "$ROOT/logdisk/filler" 2>/dev/null
    log_disks+=("$ROOT/logdisk")
  fi
  local every_step=() previous=  # SINGLE with a record every step: the event file outgrows its page mid-run
  for arg in "${SINGLE[@]}"; do
    if [ "$previous" = --log-every ]; then every_step+=(1); else every_step+=("$arg"); fi
    previous=$arg
  done
  for disk in "${log_disks[@]}"; do
    local logs=(--log-jsonl /dev/full) name="--log-jsonl /dev/full"
    [ "$disk" != /dev/full ] && logs=(--tensorboard "$disk/tb" --log-jsonl "$disk/log.jsonl") name="logs on a full tmpfs"
    rm -rf "$dir/logdisk-ck" "$dir/logdisk.json" "$dir/logdisk.pt"
    "$PTRAIN" "${every_step[@]}" "${logs[@]}" --checkpoint-dir "$dir/logdisk-ck" \
      --save-weights "$dir/logdisk.pt" --metrics-out "$dir/logdisk.json" > "$dir/logdisk.log" 2>&1
    rc=$?
    if [ $rc -ne 0 ]; then fail "full disk under the logs ($name)" "exit $rc: $(grep -m1 error "$dir/logdisk.log")"
    elif ! grep -q "ptrain: warning: .*\(No space left on device\).*training goes on without this log" "$dir/logdisk.log"; then
      fail "full disk under the logs ($name)" "no warning naming the reason: $(grep -m1 warning "$dir/logdisk.log")"
    elif [ "$(digest_of "$(latest_in "$dir/logdisk-ck")")" != "$REF" ] || [ ! -s "$dir/logdisk.pt" ] ||
         ! grep -q '"logs_given_up"' "$dir/logdisk.json"; then
      fail "full disk under the logs ($name)" "the checkpoint, weights or record are missing or differ"
    else pass "full disk under the logs ($name): warned, trained on to the reference's weights, everything saved"
    fi
  done
  mountpoint -q "$ROOT/logdisk" && umount "$ROOT/logdisk"
}
outputs
# --- ranks started differently, a port another job holds, a launcher's variables without a strategy --
# Each must stop before the first step with one error naming the setting, port or variables: no abort,
# no run trained on silently, and the other job unharmed.
ranks_that_must_agree() {
  mkdir -p "$ROOT/ranks"
  local two=(--max-steps 3 --dist-timeout 30)
  local ddp=("${BASE[@]}" --batch-size 8 --strategy ddp)  # the settings a rank's PTRAIN_* may change are no flags here
  expect_refusal() {  # name, text the output must hold, command...
    local name=$1 want=$2 out rc
    shift 2
    out=$("$@" 2>&1)
    rc=$?
    if [ $rc -eq 0 ] || [ $rc -ge 128 ]; then fail "$name" "exit $rc: $(echo "$out" | grep -m1 'error\|result')"
    elif [[ "$out" != *"$want"* ]]; then fail "$name" "does not name '$want': $(echo "$out" | grep -m1 error)"
    else pass "$name"
    fi
  }
  # $1: the shell line each rank runs before ptrain ($RANK known), then ptrain's arguments.
  launch_ranks() {
    local setup=$1
    shift
    "$PTRAIN" launch --nproc-per-node 2 --timeout 120 -- bash -c "$setup; exec \"\$0\" \"\$@\"" "$PTRAIN" "$@"
  }
  expect_refusal "ranks: PTRAIN_LR on one rank" "ranks disagree on optimizer.lr (--lr): 0.1 on rank 0; 0.5 on rank 1" \
    launch_ranks '[ $RANK = 1 ] && export PTRAIN_LR=0.5; true' "${ddp[@]}" "${two[@]}" --metrics-out "$ROOT/ranks/lr.json"
  expect_refusal "ranks: fp32 beside bf16" "ranks disagree on precision.precision" \
    launch_ranks '[ $RANK = 1 ] && export PTRAIN_PRECISION=bf16; true' "${ddp[@]}" "${two[@]}" --metrics-out "$ROOT/ranks/bf16.json"
  expect_refusal "ranks: ddp beside zero2" "ranks disagree on run.strategy (--strategy): \"ddp\" on rank 0; \"zero2\" on rank 1" \
    launch_ranks 'export PTRAIN_STRATEGY=ddp; [ $RANK = 1 ] && export PTRAIN_STRATEGY=zero2; true' \
    "${BASE[@]}" --batch-size 8 "${two[@]}" --metrics-out "$ROOT/ranks/zero2.json"
  if [ "$SHORT" = 0 ]; then
    expect_refusal "ranks: another seed on one rank" "ranks disagree on run.seed (--seed): 0 on rank 0; 6 on rank 1" \
      launch_ranks '[ $RANK = 1 ] && export PTRAIN_SEED=6; true' "${ddp[@]}" "${two[@]}" --metrics-out "$ROOT/ranks/seed.json"
  fi
  expect_refusal "ranks: launched without --strategy" "--strategy single trains in one process, but RANK=" \
    launch_ranks true "${TINY[@]}" --max-steps 3 --metrics-out "$ROOT/ranks/single.json"

  # Job A trains on a port; a launch asking for that port is refused, and a rank of another job sent to it
  # (a stale MASTER_PORT) leaves A's store alone: A ends as if nothing happened.
  local busy
  busy=$(next_port)
  "$PTRAIN" launch --nproc-per-node 2 --master-port "$busy" --timeout 120 -- "$PTRAIN" train --model resnet20 \
    --dataset synthetic --data-path 256:3x8x8:4 --device cpu --threads 1 --progress lines --test-limit 32 --batch-size 8 \
    --strategy ddp --epochs 12 --dist-timeout 30 --metrics-out "$ROOT/ranks/job-a.json" > "$ROOT/ranks/job-a.log" 2>&1 &
  local job_a=$! waited=0
  while ! grep -q "\[rank 0\] data " "$ROOT/ranks/job-a.log" 2>/dev/null && [ $waited -lt 600 ]; do sleep 0.1; waited=$((waited + 1)); done
  expect_refusal "port: a rank of another job at its store" "belongs to another job" \
    env RANK=1 WORLD_SIZE=2 MASTER_PORT="$busy" TORCHELASTIC_RUN_ID=job-b \
    "$PTRAIN" "${ddp[@]}" "${two[@]}" --metrics-out "$ROOT/ranks/intruder.json"
  expect_refusal "port: --master-port another job holds" "--master-port $busy is in use" \
    "$PTRAIN" launch --nproc-per-node 2 --master-port "$busy" -- "$PTRAIN" "${ddp[@]}" --metrics-out "$ROOT/ranks/job-b.json"
  wait $job_a
  local rc=$?
  if [ $rc -ne 0 ] || ! grep -q "\[rank 0\] result: test accuracy" "$ROOT/ranks/job-a.log"; then
    fail "port: the job holding the port" "exit $rc: $(grep -m1 error "$ROOT/ranks/job-a.log")"
  else
    pass "port: the job holding the port trained on unharmed"
  fi
}
ranks_that_must_agree
# --- the end of a run: stop signals, two runs in one --checkpoint-dir, a used directory ---------------
run_end_cases() {
  local plain=("${TINY[@]}" --seed 5 --lr 0.05 --epochs 3)  # SINGLE without a checkpoint every step
  local dir=$ROOT/sigterm pid rc step
  # SIGTERM (a scheduler's preemption): the run saves the step it stopped at and exits 143.
  "$PTRAIN" "${plain[@]}" --checkpoint-every 5 --checkpoint-dir "$dir" > "$dir.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 5000); do [ -n "$(latest_in "$dir")" ] && break; sleep 0.002; done
  kill -TERM "$pid"; wait "$pid"; rc=$?
  step=$(sed -n 's/^ptrain: stopped by SIGTERM after step \([0-9]*\) of.*/\1/p' "$dir.log")
  if [ $rc -ne 143 ]; then fail "SIGTERM mid-run" "exit $rc, not 143: $(tail -1 "$dir.log")"
  elif [ -z "$step" ] || [ "$(latest_in "$dir")" != "$(printf '%s/step-%08d.safetensors' "$dir" "$step")" ]; then
    fail "SIGTERM mid-run" "no checkpoint of the step it stopped at: $(tail -1 "$dir.log")"
  else resume_and_compare "$dir" single "SIGTERM mid-run at step $step (resumed)"
  fi
  # Two ranks under ptrain launch, which forwards the signal: both stop at the same step (at a progress
  # read), rank 0 saves it.
  dir=$ROOT/sigterm-ddp
  port=$((port + 100))  # clear of the ports the launch function hands out
  # The launcher itself in the background (not the launch function's subshell): the signal must reach it.
  "$PTRAIN" launch --nproc-per-node 2 --master-port "$port" --timeout 300 -- "$PTRAIN" "${DDP[@]}" --dist-timeout 20 \
    --checkpoint-dir "$dir" > "$dir.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 5000); do [ -n "$(latest_in "$dir")" ] && break; sleep 0.002; done
  kill -TERM "$pid"; wait "$pid"; rc=$?
  step=$(sed -n 's/^\[rank 0\] ptrain: stopped by SIGTERM after step \([0-9]*\) of.*/\1/p' "$dir.log")
  if [ $rc -ne 143 ]; then fail "SIGTERM to ptrain launch" "exit $rc, not 143: $(tail -1 "$dir.log")"
  elif [ -z "$step" ] || [ "$(latest_in "$dir")" != "$(printf '%s/step-%08d.safetensors' "$dir" "$step")" ]; then
    fail "SIGTERM to ptrain launch" "no checkpoint of the step it stopped at: $(grep -m1 'stopped\|error' "$dir.log")"
  else resume_and_compare "$dir" ddp "SIGTERM to ptrain launch at step $step (resumed)"
  fi
  # A second signal ends the run at once, as without a handler; what it left loads. (SIGTERM: a background
  # job of this shell ignores SIGINT, and ptrain keeps a signal ignored from the start ignored.)
  dir=$ROOT/sigterm-twice
  "$PTRAIN" "${plain[@]}" --checkpoint-every 1 --checkpoint-dir "$dir" > "$dir.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 5000); do [ -n "$(latest_in "$dir")" ] && break; sleep 0.002; done
  kill -TERM "$pid"; kill -TERM "$pid"; wait "$pid"; rc=$?
  if [ $rc -ne 143 ]; then fail "SIGTERM twice" "exit $rc, not 143"
  elif ! all_verify "$dir"; then fail "SIGTERM twice" "a checkpoint left behind does not load"
  else resume_and_compare "$dir" single "SIGTERM twice (resumed)"
  fi
  # A second run in the directory of a live one is refused and removes nothing; the first ends as if
  # alone.
  dir=$ROOT/two-runs
  "$PTRAIN" "${SINGLE[@]}" --checkpoint-dir "$dir" > "$dir.first.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 5000); do [ -s "$dir/.ptrain.lock" ] && break; sleep 0.002; done
  "$PTRAIN" "${SINGLE[@]}" --checkpoint-dir "$dir" --resume latest > "$dir.second.log" 2>&1; rc=$?
  wait "$pid"
  if [ $rc -ne 2 ] || ! grep -q "is in use by another run (pid $pid on" "$dir.second.log"; then
    fail "two runs, one --checkpoint-dir" "the second exited $rc: $(tail -1 "$dir.second.log")"
  elif [ "$(digest_of "$(latest_in "$dir")")" != "$REF" ] || [ "$(temporaries_in "$dir")" -ne 0 ]; then
    fail "two runs, one --checkpoint-dir" "the first run's checkpoints were disturbed"
  else pass "two runs, one --checkpoint-dir"
  fi
  # A fresh run in that used directory: refused, or with --overwrite-checkpoints the old run's files go
  # first and --keep-checkpoints keeps the new run's newest.
  bad_input "a fresh run in a used --checkpoint-dir" "--overwrite-checkpoints" "${SINGLE[@]}" --checkpoint-dir "$dir"
  "$PTRAIN" "${SINGLE[@]}" --checkpoint-dir "$dir" --overwrite-checkpoints --keep-checkpoints 2 > "$dir.over.log" 2>&1; rc=$?
  local left
  left=$(ls "$dir"/step-*.safetensors | wc -l)
  if [ $rc -ne 0 ] || [ "$left" -ne 2 ] || [ "$(digest_of "$(latest_in "$dir")")" != "$REF" ]; then
    fail "--overwrite-checkpoints --keep-checkpoints 2" "exit $rc, $left checkpoints left"
  else pass "--overwrite-checkpoints --keep-checkpoints 2"
  fi
  mkdir -p "$ROOT/bad/w.pt"
  bad_input "--save-weights is a directory" "--save-weights" "${TINY[@]}" --save-weights "$ROOT/bad/w.pt"
}
run_end_cases
# --- a pause and its resume on a cosine schedule with warm-up ----------------------------------------
# --stop-at-step pauses a run on the whole run's schedule: resumed, it must end on the weights of the run
# never paused. Cosine with warm-up gives every step a rate that depends on the run's length, which the
# constant schedule of the cases above cannot see. A resume with nothing left to train is refused by name.
pause_and_resume_cases() {
  local cosine=(train --model resnet20 --dataset synthetic --data-path 256:3x8x8:4 --device cpu --threads 1
                --progress none --test-limit 32 --log-every 4 --batch-size 16 --seed 5 --lr 0.05 --epochs 2
                --schedule cosine --warmup-steps 5)  # 16 steps an epoch, 32 in all
  local dir=$ROOT/pause want
  "$PTRAIN" "${cosine[@]}" --checkpoint-dir "$dir/whole" > "$dir.whole.log" 2>&1
  want=$(digest_of "$(latest_in "$dir/whole")")
  if [ -z "$want" ]; then fail "pause (cosine, warm-up)" "the run never paused failed: $(grep -m1 error "$dir.whole.log")"; return; fi
  local i step got
  for i in $(seq 1 "$([ "$SHORT" = 1 ] && echo 1 || echo 4)"); do
    step=$(random_between 1 31)
    rm -rf "$dir/paused"
    if ! "$PTRAIN" "${cosine[@]}" --checkpoint-dir "$dir/paused" --stop-at-step "$step" > "$dir.paused.log" 2>&1 ||
       ! grep -q "paused after step $step of 32" "$dir.paused.log"; then
      fail "pause at step $step (cosine, warm-up)" "$(tail -1 "$dir.paused.log")"; continue
    fi
    if ! "$PTRAIN" "${cosine[@]}" --checkpoint-dir "$dir/paused" --resume latest > "$dir.resumed.log" 2>&1; then
      fail "pause at step $step (cosine, warm-up), resumed" "$(grep -m1 error "$dir.resumed.log")"; continue
    fi
    got=$(digest_of "$(latest_in "$dir/paused")")
    if [ "$got" != "$want" ]; then fail "pause at step $step (cosine, warm-up), resumed" "weights $got, the run never paused has $want"
    else pass "pause at step $step (cosine, warm-up), resumed bit for bit"
    fi
  done
  bad_input "resume with nothing left to train" "this run ends at step 32 (--epochs 2 of 16 steps): nothing is left to train" \
    "${cosine[@]}" --checkpoint-dir "$dir/paused" --resume latest
}
pause_and_resume_cases

if ! no_leftovers 5; then fail "leftover processes" "$(leftovers | tr '\n' ' ')"; fi

wall=$SECONDS
echo "figures: $cases cases, $kills kills -9 landed in a live process and were survived ($kills_mid_write mid-write, $stale_removed temporary files"\
     "left and removed on resume), $flipped bytes flipped ($flips_detected refused, $flips_harmless harmless, 0 undetected)," \
     "$truncated truncations ($truncations_detected refused), wall ${wall}s"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
