"""Checks of the chart's Grafana dashboard (SPEC §17): every query names a
metric family the service exports, and every selector is scoped to `$job`.

The families exported are those `src/telemetry/metrics.rs` records (the only
place that records metrics); each must also be described there (its HELP),
so the catalogue and the recorder cannot drift apart.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

METRICS_RS = Path("src/telemetry/metrics.rs")
# Series Prometheus derives from a histogram family.
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
# A selector: a name before `{`, `[` or the end of an argument list.
SELECTOR = re.compile(r"(?<![\w:$.])([a-zA-Z_:][\w:]*)\s*(\{[^}]*\})?\s*(?=[\[{)]|$)")
PROMQL_WORDS = {
    "sum", "min", "max", "avg", "count", "rate", "increase", "irate", "by", "without",
    "histogram_quantile", "label_values", "on", "ignoring", "group_left", "group_right",
    "and", "or", "unless", "le", "bool", "offset", "topk", "bottomk", "abs", "clamp_min",
}


def families(source: str | None = None) -> dict[str, str]:
    """Family name -> kind (counter, gauge, histogram), as recorded."""
    text = source if source is not None else METRICS_RS.read_text()
    recorded = dict((n, k) for k, n in re.findall(r'\b(counter|gauge|histogram)!\(\s*"([a-z_:][a-z0-9_:]*)"', text))
    described = set(re.findall(r'\bdescribe_(?:counter|gauge|histogram)!\(\s*"([a-z_:][a-z0-9_:]*)"', text))
    undescribed = sorted(set(recorded) - described)
    unrecorded = sorted(described - set(recorded))
    assert not undescribed and not unrecorded, f"recorded without HELP: {undescribed}; described, never recorded: {unrecorded}"
    return recorded


def selectors(expr: str) -> list[tuple[str, str]]:
    """Every `(metric, matchers)` an expression selects."""
    values = re.fullmatch(r"\s*label_values\(\s*([a-zA-Z_:][\w:]*)\s*(\{[^}]*\})?\s*,[^)]*\)\s*", expr)
    if values:
        return [(values.group(1), values.group(2) or "")]
    # Grouping labels are no selectors.
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", " ", expr)
    out = []
    for name, matchers in SELECTOR.findall(expr):
        if name in PROMQL_WORDS:
            continue
        out.append((name, matchers or ""))
    return out


def family_of(name: str, known: dict[str, str]) -> str | None:
    if name in known:
        return name
    for suffix in HISTOGRAM_SUFFIXES:
        base = name.removesuffix(suffix)
        if base != name and known.get(base) == "histogram":
            return base
    return None


def queries(dashboard: dict) -> list[tuple[str, str]]:
    """`(where, expr)` of every panel target and templating query."""
    out = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel.get("targets"), f"panel {panel['title']!r} has no query"
        out += [(f"panel {panel['title']!r}", t["expr"]) for t in panel["targets"]]
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            q = var["query"]
            out.append((f"variable {var['name']!r}", q["query"] if isinstance(q, dict) else q))
    return out


def check(dashboard_text: str, known: dict[str, str] | None = None) -> int:
    """Asserts every query of the dashboard names exported families only,
    each selector scoped to the `$job` variable; returns the queries read."""
    known = known if known is not None else families()
    dashboard = json.loads(dashboard_text)
    found = queries(dashboard)
    for where, expr in found:
        picked = selectors(expr)
        assert picked, f"{where}: no metric in {expr!r}"
        for name, matchers in picked:
            assert family_of(name, known), f"{where}: {name} is not a family the service exports"
            if not where.startswith("variable"):
                assert 'job=~"$job"' in matchers, f"{where}: {name} is not scoped to $job"
    return len(found)


def self_test():
    known = {"a_total": "counter", "lat_seconds": "histogram", "g": "gauge"}
    assert selectors('sum by (x) (rate(a_total{job=~"$job"}[5m]))') == [("a_total", '{job=~"$job"}')]
    assert [n for n, _ in selectors('histogram_quantile(0.9, sum by (le) (rate(lat_seconds_bucket{job=~"$job"}[1m])))')] == ["lat_seconds_bucket"]
    assert [n for n, _ in selectors("label_values(g, job)")] == ["g"]
    assert family_of("lat_seconds_bucket", known) == "lat_seconds"
    assert family_of("a_total_bucket", known) is None
    bad = json.dumps({"panels": [{"type": "timeseries", "title": "x", "targets": [{"expr": 'rate(nope_total{job=~"$job"}[5m])'}]}]})
    try:
        check(bad, known)
    except AssertionError as e:
        assert "nope_total" in str(e)
    else:
        raise AssertionError("an unknown family passed")
    try:
        families('counter!("x_total"); describe_counter!("y_total", "")')
    except AssertionError as e:
        assert "x_total" in str(e) and "y_total" in str(e)
    else:
        raise AssertionError("a family without HELP passed")
