{{- define "aio.fullname" -}}
{{- printf "%s" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "aio.labels" -}}
app.kubernetes.io/name: ai-orchestrator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "aio.selector" -}}
app.kubernetes.io/name: ai-orchestrator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
