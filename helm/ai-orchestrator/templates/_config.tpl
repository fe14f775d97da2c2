{{/*
The service's TOML config, built from .Values.config plus the keys the chart
owns (listen addresses, SQLite path, TLS paths, auth, telemetry, per-replica
shares of provider account limits).

Helm's own toToml cannot be used: values arrive as float64, so it writes
`max_connections = 8.0`, which the service (serde, u32) rejects. The renderer
below writes whole numbers as integers; the service accepts integers for its
float keys too.
*/}}

{{- define "aio.buildConfig" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $cfg := deepCopy ($v.config | default dict) -}}

{{- $server := get $cfg "server" | default dict -}}
{{- $_ := set $server "listen" (printf "0.0.0.0:%d" (int64 $v.ports.grpc)) -}}
{{- $_ := set $server "metrics_listen" (printf "0.0.0.0:%d" (int64 $v.ports.metrics)) -}}
{{- if $v.tls.enabled -}}
{{- $tls := dict "cert" (printf "%s/server/tls.crt" (include "aio.tlsDir" $root)) "key" (printf "%s/server/tls.key" (include "aio.tlsDir" $root)) -}}
{{- if $v.tls.clientCA.secretName -}}
{{- $_ := set $tls "client_ca" (printf "%s/client-ca/%s" (include "aio.tlsDir" $root) $v.tls.clientCA.key) -}}
{{- end -}}
{{- $_ := set $server "tls" $tls -}}
{{- end -}}
{{- $_ := set $cfg "server" $server -}}
{{- if $v.http.enabled -}}
{{- $_ := set $cfg "http" (dict "listen" (printf "0.0.0.0:%d" (int64 $v.ports.http)) "cors_origins" ($v.http.corsOrigins | default list)) -}}
{{- end -}}

{{- $db := get $cfg "database" | default dict -}}
{{- if eq (include "aio.dbBackend" $root) "sqlite" -}}
{{- $_ := set $db "url" (printf "sqlite://%s/%s" (include "aio.dataDir" $root) $v.database.sqlite.file) -}}
{{- end -}}
{{- $_ := set $cfg "database" $db -}}

{{- /* With a cluster store the numbers are the account's, shared by every
   replica; without one each replica gets its share of them. */ -}}
{{- $replicas := int64 (include "aio.maxReplicas" $root) -}}
{{- if include "aio.clusterEnabled" $root -}}
{{- $replicas = 1 -}}
{{- $cluster := dict "key_prefix" $v.cluster.keyPrefix "on_unavailable" $v.cluster.onUnavailable "fallback_share" $v.cluster.fallbackShare -}}
{{- if $v.valkey.enabled -}}
{{- $_ := set $cluster "redis_url" (printf "redis://%s:6379/0" (include "aio.valkeyName" $root)) -}}
{{- end -}}
{{- $_ := set $cfg "cluster" $cluster -}}
{{- end -}}
{{- range $name, $limits := $v.providerAccountLimits -}}
{{- $p := index ($cfg.providers | default dict) $name | default dict -}}
{{- if $limits.rpm -}}
{{- $_ := set $p "rpm" (max 1 (div (int64 $limits.rpm) $replicas)) -}}
{{- end -}}
{{- if $limits.maxConcurrency -}}
{{- $_ := set $p "max_concurrency" (max 1 (div (int64 $limits.maxConcurrency) $replicas)) -}}
{{- end -}}
{{- end -}}

{{- if $v.auth.enabled -}}
{{- $_ := set $cfg "auth" (dict "enabled" true "keys" $v.auth.keys) -}}
{{- end -}}
{{- if $v.telemetry.otlpEndpoint -}}
{{- $_ := set $cfg "telemetry" (dict "otlp_endpoint" $v.telemetry.otlpEndpoint) -}}
{{- end -}}
{{- $_ := set .out "config" $cfg -}}
{{- end -}}

{{- define "aio.configToml" -}}
{{- $out := dict -}}
{{- $_ := include "aio.buildConfig" (dict "root" . "out" $out) -}}
# Rendered by the ai-orchestrator Helm chart from .Values.config; edit the values, not this file.
{{- include "aio.toml.table" (dict "path" "" "table" $out.config) }}
{{- end -}}

{{/* TOML renderer ------------------------------------------------------------ */}}

{{- define "aio.toml.key" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . -}}
{{- . -}}
{{- else -}}
{{- toJson . -}}
{{- end -}}
{{- end -}}

{{/* JSON string escapes are all valid TOML basic-string escapes. */}}
{{- define "aio.toml.value" -}}
{{- $v := . -}}
{{- if kindIs "string" $v -}}
{{- toJson $v -}}
{{- else if kindIs "bool" $v -}}
{{- $v -}}
{{- else if or (kindIs "float64" $v) (kindIs "int" $v) (kindIs "int64" $v) -}}
{{- if eq (float64 $v) (float64 (int64 $v)) -}}{{ int64 $v }}{{- else -}}{{ $v }}{{- end -}}
{{- else if kindIs "slice" $v -}}
[{{- range $i, $e := $v -}}{{ if $i }}, {{ end }}{{ include "aio.toml.value" $e }}{{- end -}}]
{{- else if kindIs "map" $v -}}
{{- $parts := list -}}
{{- range $k, $e := $v -}}
{{- if not (kindIs "invalid" $e) -}}
{{- $parts = append $parts (printf "%s = %s" (include "aio.toml.key" $k) (include "aio.toml.value" $e)) -}}
{{- end -}}
{{- end -}}
{{- if $parts -}}{ {{ join ", " $parts }} }{{- else -}}{}{{- end -}}
{{- else -}}
{{- fail (printf "config: cannot write %v (%s) as TOML" $v (kindOf $v)) -}}
{{- end -}}
{{- end -}}

{{/* A table: its plain keys under its [header], then each sub-table. Headers
of tables holding only sub-tables are left out ([providers] adds nothing). */}}
{{- define "aio.toml.table" -}}
{{- $path := .path -}}
{{- $table := .table -}}
{{- $plain := list -}}
{{- $subs := list -}}
{{- range $k, $e := $table -}}
{{- if kindIs "map" $e -}}
{{- $subs = append $subs $k -}}
{{- else if not (kindIs "invalid" $e) -}}
{{- $plain = append $plain $k -}}
{{- end -}}
{{- end -}}
{{- if and $path (or $plain (not $subs)) }}

[{{ $path }}]
{{- end -}}
{{- range $k := $plain }}
{{ include "aio.toml.key" $k }} = {{ include "aio.toml.value" (index $table $k) }}
{{- end -}}
{{- range $k := $subs -}}
{{- $sub := ternary (include "aio.toml.key" $k) (printf "%s.%s" $path (include "aio.toml.key" $k)) (empty $path) -}}
{{- include "aio.toml.table" (dict "path" $sub "table" (index $table $k)) -}}
{{- end -}}
{{- end -}}
