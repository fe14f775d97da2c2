{{/*
Guard rails: values that would render but fail (or quietly misbehave) in the
cluster are refused here, at `helm install`/`template` time, with the fix in
the message. values.schema.json covers shapes; these cover combinations.
*/}}
{{- define "aio.validate" -}}
{{- $v := .Values -}}
{{- $cfg := $v.config | default dict -}}
{{- $backend := include "aio.dbBackend" . -}}
{{- $devEnv := ternary ($v.devSecret.env | default (dict)) (dict) (eq $v.devSecret.create true) -}}

{{- if and $v.database.existingSecret (hasKey $devEnv "DATABASE_URL") -}}
{{- fail "DATABASE_URL comes from both database.existingSecret and devSecret.env: keep one." -}}
{{- end -}}
{{- with get $devEnv "DATABASE_URL" -}}
{{- if not (regexMatch "^postgres(ql)?://" .) -}}
{{- fail "devSecret.env.DATABASE_URL must be a postgres:// URL (SQLite needs no secret: leave it out)." -}}
{{- end -}}
{{- end -}}

{{- /* SQLite is a file on one pod's volume: a second pod would have its own
   ledger (caps no longer hold), and at start-up a pod charges every open
   reservation in its file as orphaned, which is only right with one owner. */ -}}
{{- if eq $backend "sqlite" -}}
{{- if gt (int64 $v.replicaCount) 1 -}}
{{- fail (printf "replicaCount=%d with SQLite: SQLite is per pod, so several replicas must share PostgreSQL. Set database.existingSecret to a Secret holding DATABASE_URL=postgres://..., or replicaCount=1." (int64 $v.replicaCount)) -}}
{{- end -}}
{{- if $v.autoscaling.enabled -}}
{{- fail "autoscaling.enabled with SQLite: the HPA would start replicas with separate ledgers. Use PostgreSQL (database.existingSecret) to autoscale." -}}
{{- end -}}
{{- if eq (dig "type" "" $v.strategy) "RollingUpdate" -}}
{{- fail "strategy.type=RollingUpdate with SQLite: old and new pod would share (or fight over) one database file during the roll. Leave strategy empty (the chart uses Recreate) or use PostgreSQL." -}}
{{- end -}}
{{- else -}}
{{- if $v.persistence.enabled -}}
{{- fail "persistence.enabled with PostgreSQL: the service writes nothing locally when DATABASE_URL is PostgreSQL. Set persistence.enabled=false." -}}
{{- end -}}
{{- end -}}

{{- /* Keys the chart sets itself; a second source would be silently lost. */ -}}
{{- $server := $cfg.server | default dict -}}
{{- range $k := list "listen" "metrics_listen" "tls" -}}
{{- if hasKey $server $k -}}
{{- fail (printf "config.server.%s is set by the chart (from ports.* / tls.*): remove it from config." $k) -}}
{{- end -}}
{{- end -}}
{{- if hasKey ($cfg.database | default dict) "url" -}}
{{- fail "config.database.url is set by the chart: SQLite from database.sqlite.file, PostgreSQL from a Secret (database.existingSecret), so no password lands in a ConfigMap." -}}
{{- end -}}
{{- if hasKey $cfg "auth" -}}
{{- fail "config.auth is set by the chart: use auth.enabled and auth.keys." -}}
{{- end -}}
{{- if hasKey $cfg "cluster" -}}
{{- fail "config.cluster is set by the chart: use valkey.enabled or cluster.existingSecret (and cluster.*)." -}}
{{- end -}}
{{- if and $v.valkey.enabled $v.cluster.existingSecret -}}
{{- fail "valkey.enabled and cluster.existingSecret both name a cluster store: keep one." -}}
{{- end -}}
{{- if hasKey $cfg "telemetry" -}}
{{- fail "config.telemetry is set by the chart: use telemetry.otlpEndpoint." -}}
{{- end -}}

{{- /* Every provider key must come from a Secret, or the pod starts and the
   service exits with "environment variable ... is not set". */ -}}
{{- $providers := $cfg.providers | default dict -}}
{{- $refs := $v.providerKeys.keys | default dict -}}
{{- range $name, $p := $providers -}}
{{- if $p -}}
{{- with $p.api_key_env -}}
{{- if and (not (hasKey $refs .)) (not (hasKey $devEnv .)) -}}
{{- fail (printf "config.providers.%s.api_key_env=%s has no Secret reference: add providerKeys.keys.%s: {key: <key in the Secret>} (Secret %q unless secretName is given)." $name . . $v.providerKeys.secretName) -}}
{{- end -}}
{{- if and (hasKey $refs .) (hasKey $devEnv .) -}}
{{- fail (printf "%s is referenced by both providerKeys.keys and devSecret.env: keep one." .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $env, $ref := $refs -}}
{{- if not (or $ref.secretName $v.providerKeys.secretName) -}}
{{- fail (printf "providerKeys.keys.%s: no secretName and no providerKeys.secretName default." $env) -}}
{{- end -}}
{{- end -}}
{{- range $task, $t := $cfg.tasks | default dict -}}
{{- range $i, $target := ($t | default dict).chain | default list -}}
{{- if not (index $providers $target.provider) -}}
{{- fail (printf "config.tasks.%s.chain[%d].provider: unknown provider %q (was it removed from config.providers?)." $task $i $target.provider) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $name, $limits := $v.providerAccountLimits -}}
{{- $p := index $providers $name -}}
{{- if not $p -}}
{{- fail (printf "providerAccountLimits.%s: no such provider in config.providers." $name) -}}
{{- end -}}
{{- if and $limits.rpm (hasKey $p "rpm") (not (kindIs "invalid" $p.rpm)) -}}
{{- fail (printf "providerAccountLimits.%s.rpm and config.providers.%s.rpm are both set: keep one (set the config key to null)." $name $name) -}}
{{- end -}}
{{- if and $limits.maxConcurrency (hasKey $p "max_concurrency") (not (kindIs "invalid" $p.max_concurrency)) -}}
{{- fail (printf "providerAccountLimits.%s.maxConcurrency and config.providers.%s.max_concurrency are both set: keep one (set the config key to null)." $name $name) -}}
{{- end -}}
{{- end -}}

{{- /* Shutdown: the kubelet must not SIGKILL before the drain and flush end. */ -}}
{{- $floor := add (int64 $v.lifecycle.preStopSleepSeconds) (int64 (include "aio.shutdownGraceSeconds" .)) -}}
{{- if le (int64 (include "aio.terminationGracePeriodSeconds" .)) $floor -}}
{{- fail (printf "terminationGracePeriodSeconds=%s must exceed lifecycle.preStopSleepSeconds + config.server.shutdown_grace = %d s, plus time to flush usage (leave it null: the chart adds 15 s)." (include "aio.terminationGracePeriodSeconds" .) $floor) -}}
{{- end -}}

{{- if $v.tls.enabled -}}
{{- if not $v.tls.secretName -}}
{{- fail "tls.enabled needs tls.secretName: a kubernetes.io/tls Secret (tls.crt, tls.key)." -}}
{{- end -}}
{{- range $probe := list $v.probes.liveness $v.probes.readiness $v.probes.startup -}}
{{- if eq (include "aio.probeType" (dict "root" $ "probe" $probe)) "grpc" -}}
{{- fail "gRPC probes with tls.enabled: the kubelet's gRPC probe cannot speak TLS. Use probes.type=auto or http (the plain-HTTP /healthz and /readyz on the metrics port)." -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- if and $v.auth.enabled (not $v.auth.keys) -}}
{{- fail "auth.enabled with no auth.keys: every call would be refused. Add at least one key (see docs/operations.md, Authentication)." -}}
{{- end -}}

{{- if $v.autoscaling.enabled -}}
{{- if gt (int64 $v.autoscaling.minReplicas) (int64 $v.autoscaling.maxReplicas) -}}
{{- fail "autoscaling.minReplicas is above autoscaling.maxReplicas." -}}
{{- end -}}
{{- end -}}

{{- /* A PDB that admits no eviction blocks every node drain. */ -}}
{{- with $v.podDisruptionBudget -}}
{{- if and .enabled (not (kindIs "invalid" .minAvailable)) (not (kindIs "string" .minAvailable)) -}}
{{- $replicas := ternary $v.autoscaling.minReplicas $v.replicaCount $v.autoscaling.enabled -}}
{{- if ge (int64 .minAvailable) (int64 $replicas) -}}
{{- fail (printf "podDisruptionBudget.minAvailable=%d with %d replica(s) allows no eviction and would block node drains." (int64 .minAvailable) (int64 $replicas)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
