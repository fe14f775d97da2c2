#!/bin/bash
# A/B of two server builds: Execute, SQLite full, 1,000 rps, 0 ms upstream, 10 s, alternating.
for i in 1 2 3 4; do
  for b in old new; do
    [ $((i % 2)) -eq 0 ] && { [ $b = old ] && b=new || b=old; }
    target/release/bench --server-bin /tmp/aio-$b --scenarios load --rpcs execute --metering sqlite --rates 1000 --upstream-latency-ms 0 --duration 10 --out /tmp/ab/$b-$i > /tmp/ab/$b-$i.log 2>&1
    echo "$b-$i done"
  done
done
