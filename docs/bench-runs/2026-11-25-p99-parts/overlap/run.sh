#!/bin/sh
for r in 1 2 3; do
  for v in base-server ovl-server ovl-c10000; do
    /tmp/base-bench --server-bin /tmp/$v --metering sqlite --rpcs execute --rates 1000,3000 \
      --upstream-latency-ms 0 --duration 20 --scenarios load,direct --out /tmp/ovl/$v-$r > /dev/null 2>&1
  done
done
