#!/bin/sh
# Alternated rounds, 20 s steps at 1,000 rps, Execute, 0 ms upstream.
for r in 1 2 3; do
  for v in base-server exp-nores exp-nockpt exp-nores-nockpt exp-nores-c10000; do
    m=sqlite,sqlite-normal; [ $v = base-server ] && m=sqlite,sqlite-normal,off
    /tmp/base-bench --server-bin /tmp/$v --metering $m --rpcs execute --rates 1000 \
      --upstream-latency-ms 0 --duration 20 --scenarios load,direct --out /tmp/p99parts/$v-$r > /dev/null 2>&1
  done
done
