"""Summary of the A/B rounds: python3 sum.py (from this folder)."""
import json

for build in ["old", "new"]:
    for i in range(1, 5):
        s = json.load(open(f"{build}-{i}/results.json"))["steps"][0]
        ledger = s["ledger"]
        print(
            build, i,
            "cpu s/1k %.3f" % s["server_cpu_s_per_1k"],
            "p50/p99 %.2f/%.2f ms" % (s["latency_us"]["p50"] / 1e3, s["latency_us"]["p99"] / 1e3),
            "commit mean %.1f µs p99 %.0f" % (ledger["commit_us"]["mean"], ledger["commit_us"]["p99"]),
            "sync p50 %.0f µs p99 %.0f" % (ledger["sync_us"]["p50"], ledger["sync_us"]["p99"]),
            "ops/commit %.2f" % ledger["ops_per_commit"],
        )
