#!/usr/bin/env bash
# The background load: two busy processes (one per core of a 2-core machine), on for 4 s then off for 3 s,
# at the bench's own priority, until killed: the stalls a shared machine gives a run at random moments.
set -u
while true; do
  for i in 1 2; do timeout 4 sh -c 'while :; do :; done' & done
  wait
  sleep 3
done
