#!/usr/bin/env bash
# Alternated A/B rounds of set2 (set1: builds base b ab, out=/tmp/ab1): base (2cc4530), ab (writer thread, reservation-only batches left to the wal-sync thread), abl (ab + reservations linger 1 ms).
set -u
out=/tmp/ab2
for round in 1 2 3; do
  for build in base ab abl; do
    /tmp/bin/bench --server-bin /tmp/bin/$build --metering sqlite --rpcs execute \
      --rates 1000,3000 --upstream-latency-ms 0 --duration 20 --scenarios load,direct \
      --out $out/$build-$round > $out/$build-$round.log 2>&1
  done
done
