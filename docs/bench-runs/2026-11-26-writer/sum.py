"""Per build and offered rate, one value per round: client-side added p50 /
p99, server overhead p99, settlement wait p50 / p99, WAL syncs per call,
server CPU s per 1k, direct p99 (ms). Reads `<build>-<round>/results.json`
(as run.sh writes them) or `<build>-<round>.json` under the folder given:
`python3 sum.py set1 base,b,ab`, `python3 sum.py set2 base,ab,abl`."""
import json, os, sys
root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(__file__) or '.'
builds = sys.argv[2].split(',') if len(sys.argv) > 2 else ['base', 'b', 'ab']
rows = {}
for v in builds:
    for r in range(1, 10):
        p = f'{root}/{v}-{r}/results.json'
        if not os.path.exists(p):
            p = f'{root}/{v}-{r}.json'
        if not os.path.exists(p):
            continue
        d = json.load(open(p))
        direct = {(s['rpc'], s['offered_rps']): s['latency_us'] for s in d['steps'] if s['via'] == 'direct'}
        for s in d['steps']:
            if s['via'] != 'orchestrator':
                continue
            a, o, l = s['added_latency_us'], s['server_overhead_us'], s['ledger'] or {}
            sw = l.get('settle_wait_us') or {}
            syncs = (l.get('sync_us') or {}).get('count', 0) / max(s['ok'], 1)
            rows.setdefault((s['offered_rps'], s['metering'], v), []).append(
                (a['p50'] / 1e3, a['p99'] / 1e3, o['p99'] / 1e3, sw.get('p50', 0) / 1e3, sw.get('p99', 0) / 1e3,
                 syncs, s['server_cpu_s_per_1k'], direct[(s['rpc'], s['offered_rps'])]['p99'] / 1e3))
print('| rps | metering | build | added p50 | added p99 | overhead p99 | settle wait p50 | settle wait p99 | syncs/call | CPU s/1k | direct p99 |')
print('|---|---|---|---|---|---|---|---|---|---|---|')
for (rate, m, v), xs in sorted(rows.items(), key=lambda kv: (kv[0][0], kv[0][1], builds.index(kv[0][2]))):
    f = lambda i: ' / '.join(f'{x[i]:.2f}' for x in xs)
    print(f'| {rate:.0f} | {m} | {v} | {f(0)} | {f(1)} | {f(2)} | {f(3)} | {f(4)} | {f(5)} | {f(6)} | {f(7)} |')
