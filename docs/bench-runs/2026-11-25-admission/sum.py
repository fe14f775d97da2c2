"""Prints, per build and metering mode, added p50 / p99, server overhead p99
(ms), server CPU s per 1k and the direct p99, one value per round, from
`<set>-<build>-<round>.json` here or `<build>-<round>/results.json` (as
run.sh writes them) under the folder given."""
import json, os, sys
root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(__file__) or '.'
rows = {}
for s_ in ('a', 'b', None):
    for v in ('base', 'new'):
        for r in (1, 2, 3):
            p = f'{root}/{s_}-{v}-{r}.json' if s_ else f'{root}/{v}-{r}/results.json'
            if not os.path.exists(p):
                continue
            d = json.load(open(p))
            direct = [s for s in d['steps'] if s['via'] == 'direct'][0]['latency_us']
            for s in d['steps']:
                if s['via'] != 'orchestrator':
                    continue
                a, o = s['added_latency_us'], s['server_overhead_us']
                rows.setdefault((s_, v, s['metering']), []).append(
                    (a['p50'] / 1000, a['p99'] / 1000, o['p99'] / 1000, s['server_cpu_s_per_1k'], direct['p99'] / 1000))
for (s_, v, m), xs in rows.items():
    f = lambda i: ' / '.join(f'{x[i]:.2f}' for x in xs)
    print(f'| {s_ or "-"} | {v} | {m} | added p50 {f(0)} | added p99 {f(1)} | overhead p99 {f(2)} | CPU s/1k {f(3)} | direct p99 {f(4)} |')
