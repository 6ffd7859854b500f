{{/* The chart's name, or nameOverride. */}}
{{- define "ratelimit.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The objects' name: fullnameOverride, else the release name when it already
holds the chart's name (release "ratelimit" gives "ratelimit"), else
release-chart. Kubernetes names stop at 63 characters.
*/}}
{{- define "ratelimit.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "ratelimit.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "ratelimit.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* The labels that select the pods: they never change after install. */}}
{{- define "ratelimit.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ratelimit.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Every object's labels. */}}
{{- define "ratelimit.labels" -}}
{{ include "ratelimit.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* The rules' ConfigMap: the existing one, or the chart's. */}}
{{- define "ratelimit.rulesConfigMap" -}}
{{- .Values.rules.existingConfigMap | default (printf "%s-rules" (include "ratelimit.fullname" .)) }}
{{- end }}

{{/* Whether more than one pod may run. */}}
{{- define "ratelimit.many" -}}
{{- if or .Values.autoscaling.enabled (gt (int .Values.replicaCount) 1) }}true{{ end }}
{{- end }}
