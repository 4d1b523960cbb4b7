#!/usr/bin/env bash
# Session 11 call 2: batch-norm tiling variants in the bench (bf16 cold and warm).
R=$OUT/r; mkdir -p $R
t0=$(date +%s)
bash .data/variants.sh v0 "-Xptxas -v" v1 "-DBN_MIN_ROWS=8" v2 "-DBN_MIN_ROWS=16" v3 "-DBN_MIN_ROWS=32" \
  v4 "-DBN_MIN_ROWS=16 -DBN_STATS_ROWS=8 -DBN_BACKWARD_ROWS=4 -Xptxas -v" v5 "-DBN_MIN_ROWS=32 -DBN_STATS_ROWS=8 -DBN_BACKWARD_ROWS=4" \
  v6 "-DBN_MIN_ROWS=64 -DBN_STATS_ROWS=8 -DBN_BACKWARD_ROWS=4" v7 "-DBN_MIN_ROWS=8 -DBN_STATS_ROWS=8 -DBN_BACKWARD_ROWS=4"
cp build-var/*.log $R/
echo "built $(( $(date +%s) - t0 )) s"
for v in v0 v1 v2 v3 v4 v5 v6 v7; do
  timeout 60 build-var/bnb-$v --dtype bf16 > $R/$v-cold.txt 2>&1
  timeout 60 build-var/bnb-$v --dtype bf16 --warm > $R/$v-warm.txt 2>&1
  echo "$v cold: $(tail -1 $R/$v-cold.txt | cut -c40-)"
  echo "$v warm: $(tail -1 $R/$v-warm.txt | cut -c40-)"
done
echo "all done $(( $(date +%s) - t0 )) s"
