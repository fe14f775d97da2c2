"""One row per variant and rate: added p50, added p99, server overhead p99 (ms),
CPU s per 1k, achieved rps, errors; one value per round."""
import json, os, sys
root = sys.argv[1]
rows = {}
for v in ['base-server', 'ovl-server', 'ovl-c10000']:
    for r in (1, 2, 3):
        # A run's folder (as run.sh writes it) or its results.json copied here.
        p = f'{root}/{v}-{r}/results.json'
        if not os.path.exists(p): p = f'{root}/{v}-{r}.json'
        if not os.path.exists(p): continue
        d = json.load(open(p))
        for s in d['steps']:
            if s['via'] != 'orchestrator': continue
            a, o = s['added_latency_us'], s['server_overhead_us']
            rows.setdefault((v, int(s['offered_rps'])), []).append((a['p50']/1000, a['p99']/1000, o['p99']/1000, s['server_cpu_s_per_1k'], s['achieved_rps'], s['errors']))
for (v, rate), xs in sorted(rows.items(), key=lambda k: (k[0][1], k[0][0])):
    f = lambda i: ' / '.join(f'{x[i]:.2f}' for x in xs)
    print(f'| {v} | {rate} | {f(0)} | {f(1)} | {f(2)} | {f(3)} | {f(4)} | {f(5)} |')
