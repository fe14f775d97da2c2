"""Values the chart must refuse, with the message it must give (guard rails
of templates/_validate.tpl and values.schema.json); used by helm_check.py."""
from __future__ import annotations


def bad_values(merge) -> list[tuple[str, dict, str]]:
    """`(label, values, message)` of every refused value set."""
    PG = {"database": {"existingSecret": "db"}, "persistence": {"enabled": False}}
    return [
        ("several replicas on SQLite", {"replicaCount": 3}, "several replicas must share PostgreSQL"),
        ("HPA on SQLite", {"autoscaling": {"enabled": True}}, "autoscaling.enabled with SQLite"),
        ("RollingUpdate on SQLite", {"strategy": {"type": "RollingUpdate"}}, "strategy.type=RollingUpdate with SQLite"),
        ("PVC with PostgreSQL", {"database": {"existingSecret": "db"}}, "persistence.enabled with PostgreSQL"),
        ("provider key without a Secret reference", {"providerKeys": {"keys": {"OPENAI_API_KEY": None}}},
         "config.providers.openai.api_key_env=OPENAI_API_KEY has no Secret reference"),
        ("new provider without a Secret reference",
         {"config": {"providers": {"gemini": {"kind": "gemini", "api_key_env": "GEMINI_API_KEY"}}}},
         "GEMINI_API_KEY has no Secret reference"),
        ("key in both providerKeys and devSecret",
         {"devSecret": {"create": True, "env": {"OPENAI_API_KEY": "x"}}}, "referenced by both"),
        ("SQLite URL in the dev Secret",
         {"devSecret": {"create": True, "env": {"DATABASE_URL": "sqlite://x.db"}}}, "must be a postgres:// URL"),
        ("listen address in config", {"config": {"server": {"listen": "127.0.0.1:50051"}}}, "config.server.listen is set by the chart"),
        ("HTTP edge in config", {"config": {"http": {"listen": "0.0.0.0:8080"}}}, "additional properties 'http'"),
        ("schema: CORS origin with a path", {"http": {"enabled": True, "corsOrigins": ["https://a.example/x"]}}, "corsOrigins"),
        ("database URL in config", {"config": {"database": {"url": "postgres://u:pw@db/x"}}}, "config.database.url is set by the chart"),
        ("auth in config", {"config": {"auth": {"enabled": True}}}, "use auth.enabled"),
        ("cluster in config", {"config": {"cluster": {"redis_url": "redis://x:6379"}}}, "config.cluster is set by the chart"),
        ("two cluster stores", {"valkey": {"enabled": True}, "cluster": {"existingSecret": "r"}}, "keep one"),
        ("grace period too short", {"terminationGracePeriodSeconds": 30}, "must exceed lifecycle.preStopSleepSeconds"),
        ("TLS without a Secret", {"tls": {"enabled": True}}, "tls.enabled needs tls.secretName"),
        ("gRPC probes with TLS", {"tls": {"enabled": True, "secretName": "t"}, "probes": {"type": "grpc"}},
         "cannot speak TLS"),
        ("auth on with no keys", {"auth": {"enabled": True}}, "auth.enabled with no auth.keys"),
        ("HPA min above max", merge(PG, {"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2}}),
         "minReplicas is above"),
        ("PDB blocking drains", merge(PG, {"replicaCount": 2, "podDisruptionBudget": {"minAvailable": 2}}),
         "would block node drains"),
        ("chain to a removed provider", {"config": {"providers": {"anthropic": None}}, "providerKeys": {"keys": {"ANTHROPIC_API_KEY": None}}},
         'unknown provider "anthropic"'),
        ("account limit and per-replica rpm", {"providerAccountLimits": {"openai": {"rpm": 100}}},
         "are both set"),
        ("account limit for an unknown provider", {"providerAccountLimits": {"nope": {"rpm": 100}}}, "no such provider"),
        # values.schema.json
        ("schema: unknown config key", {"config": {"server": {"listne": "x"}}}, "additional properties 'listne'"),
        ("schema: bad duration", {"config": {"server": {"shutdown_grace": "30 seconds"}}}, "shutdown_grace"),
        ("schema: unknown provider kind", {"config": {"providers": {"x": {"kind": "bedrock"}}}}, "kind"),
        ("schema: key instead of hash", {"auth": {"enabled": True, "keys": [
            {"name": "a", "sha256": "sk-live-123", "teams": ["t1"], "role": "caller"}]}}, "sha256"),
        ("schema: bad role", {"auth": {"enabled": True, "keys": [
            {"name": "a", "sha256": "0" * 64, "teams": ["t1"], "role": "root"}]}}, "role"),
        ("schema: replicaCount as text", {"replicaCount": "three"}, "replicaCount"),
        ("schema: probe type", {"probes": {"type": "tcp"}}, "probes/type"),
        ("schema: unknown top-level value", {"replicas": 3}, "additional properties 'replicas'"),
    ]
