"""Prints one table row per variant and metering mode: added p50, added p99,
server overhead p99 (ms) and server CPU s per 1k, one value per round."""
import json, os, sys, statistics
root = sys.argv[1]
variants = ['base-server', 'exp-nores', 'exp-nockpt', 'exp-nores-nockpt', 'exp-nores-c10000']
rows = {}
for v in variants:
    for r in (1, 2, 3):
        # A run's folder (as run.sh writes it) or its results.json copied here.
        p = f'{root}/{v}-{r}/results.json'
        if not os.path.exists(p):
            p = f'{root}/{v}-{r}.json'
        if not os.path.exists(p):
            continue
        d = json.load(open(p))
        direct = [s for s in d['steps'] if s['via'] == 'direct'][0]['latency_us']
        for s in d['steps']:
            if s['via'] != 'orchestrator':
                continue
            a, o = s['added_latency_us'], s['server_overhead_us']
            rows.setdefault((v, s['metering']), []).append(
                (a['p50'] / 1000, a['p99'] / 1000, o['p50'] / 1000, o['p99'] / 1000, s['server_cpu_s_per_1k'], direct['p99'] / 1000))
for (v, m), xs in rows.items():
    f = lambda i: ' / '.join(f'{x[i]:.2f}' for x in xs)
    print(f'| {v} | {m} | {f(0)} | {f(1)} | {f(3)} | {f(4)} |')
