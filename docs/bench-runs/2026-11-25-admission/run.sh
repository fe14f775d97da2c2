#!/bin/sh
# Alternated rounds, 20 s steps at 1,000 rps, Execute, 0 ms upstream.
for r in 1 2 3; do
  for v in base new; do
    /work/main/target/release/bench --server-bin /tmp/aio-$v --metering sqlite,sqlite-normal --rpcs execute --rates 1000 \
      --upstream-latency-ms 0 --duration 20 --scenarios load,direct --out /tmp/ab/$v-$r > /tmp/ab/$v-$r.log 2>&1
  done
done
echo finished > /tmp/ab/done
