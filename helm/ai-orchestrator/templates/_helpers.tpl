{{/* Names ------------------------------------------------------------------ */}}

{{- define "aio.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Release "ai-orchestrator" gives "ai-orchestrator", not "ai-orchestrator-ai-orchestrator". */}}
{{- define "aio.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "aio.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "aio.selectorLabels" -}}
app.kubernetes.io/name: {{ include "aio.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "aio.labels" -}}
helm.sh/chart: {{ include "aio.chart" . }}
{{ include "aio.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/component: server
app.kubernetes.io/part-of: ai-orchestrator
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "aio.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "aio.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* A digest pins the exact build and wins over the tag. */}}
{{- define "aio.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{- define "aio.devSecretName" -}}
{{- printf "%s-dev" (include "aio.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Fixed paths inside the container ------------------------------------- */}}

{{/* The fleet's shared limits are on with a store: the chart's Valkey or an
external one named by a Secret. */}}
{{- define "aio.clusterEnabled" -}}
{{- if or .Values.valkey.enabled .Values.cluster.existingSecret -}}true{{- end -}}
{{- end -}}

{{- define "aio.valkeyName" -}}
{{- printf "%s-valkey" (include "aio.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "aio.configDir" -}}/etc/ai-orchestrator{{- end -}}
{{- define "aio.dataDir" -}}/var/lib/ai-orchestrator{{- end -}}
{{- define "aio.tlsDir" -}}/etc/tls/ai-orchestrator{{- end -}}

{{/* Database backend ------------------------------------------------------
"postgres" when a URL comes from a Secret (or the dev Secret), else "sqlite".
The chart never sees the content of an existing Secret, so a Secret is taken
to hold a PostgreSQL URL: SQLite needs no secret. */}}
{{- define "aio.dbBackend" -}}
{{- $dev := .Values.devSecret -}}
{{- if .Values.database.existingSecret -}}
postgres
{{- else if and $dev.create (hasKey ($dev.env | default dict) "DATABASE_URL") -}}
postgres
{{- else -}}
sqlite
{{- end -}}
{{- end -}}

{{/* Durations --------------------------------------------------------------
Whole seconds, rounded up, of a humantime duration such as "30s", "1m30s" or
"500ms" (the subset values.schema.json admits). */}}
{{- define "aio.seconds" -}}
{{- $ms := 0 -}}
{{- range regexFindAll "[0-9]+(ms|s|m|h)" (toString .) -1 -}}
{{- $n := regexFind "^[0-9]+" . | int64 -}}
{{- $unit := trimPrefix (regexFind "^[0-9]+" .) . -}}
{{- $scale := get (dict "ms" 1 "s" 1000 "m" 60000 "h" 3600000) $unit -}}
{{- $ms = add $ms (mul $n $scale) -}}
{{- end -}}
{{- div (add $ms 999) 1000 -}}
{{- end -}}

{{- define "aio.shutdownGraceSeconds" -}}
{{- $server := .Values.config.server | default dict -}}
{{- include "aio.seconds" ($server.shutdown_grace | default "30s") -}}
{{- end -}}

{{/* The pod must outlive the preStop pause, the drain and the final usage
flush, or the kubelet SIGKILLs it with acknowledged calls still unrecorded. */}}
{{- define "aio.terminationGracePeriodSeconds" -}}
{{- $floor := add (int64 .Values.lifecycle.preStopSleepSeconds) (int64 (include "aio.shutdownGraceSeconds" .)) -}}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds -}}
{{- add $floor 15 -}}
{{- else -}}
{{- int64 .Values.terminationGracePeriodSeconds -}}
{{- end -}}
{{- end -}}

{{/* Replicas the per-replica limits are divided by: with an HPA, the most
pods that can run at once, so the account limit holds at full scale-out. */}}
{{- define "aio.maxReplicas" -}}
{{- if .Values.autoscaling.enabled -}}
{{- int64 .Values.autoscaling.maxReplicas -}}
{{- else -}}
{{- int64 .Values.replicaCount -}}
{{- end -}}
{{- end -}}

{{/* Probes -------------------------------------------------------------------
"auto" picks gRPC, except with TLS: the kubelet's gRPC probe speaks only
plaintext, so the plain-HTTP endpoints on the metrics port take over. */}}
{{- define "aio.probeType" -}}
{{- $type := .probe.type | default .root.Values.probes.type -}}
{{- if eq $type "auto" -}}
{{- ternary "http" "grpc" .root.Values.tls.enabled -}}
{{- else -}}
{{- $type -}}
{{- end -}}
{{- end -}}

{{/* One probe. `check` is "readiness" (this service, NOT_SERVING when the
database is unreachable or while draining) or "liveness" (the process). */}}
{{- define "aio.probe" -}}
{{- $root := .root -}}
{{- $type := include "aio.probeType" (dict "root" $root "probe" .probe) -}}
{{- if eq $type "grpc" }}
grpc:
  port: {{ $root.Values.ports.grpc }}
  {{- if eq .check "readiness" }}
  service: ai.orchestrator.v1.Orchestrator
  {{- end }}
{{- else }}
httpGet:
  path: {{ ternary "/readyz" "/healthz" (eq .check "readiness") }}
  port: metrics
{{- end }}
{{- range $k := list "initialDelaySeconds" "periodSeconds" "timeoutSeconds" "failureThreshold" "successThreshold" }}
{{- if hasKey $.probe $k }}
{{ $k }}: {{ index $.probe $k }}
{{- end }}
{{- end }}
{{- end -}}
