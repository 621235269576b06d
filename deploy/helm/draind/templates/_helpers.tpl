{{/*
Labels of every object's metadata: the kustomize base's part-of label,
Helm's bookkeeping and the operator's commonLabels. Selectors and pod
templates never carry the release-specific ones, so they stay the base's.
*/}}
{{- define "draind.labels" -}}
app.kubernetes.io/part-of: draind
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The image of the DaemonSet, the webhook and the injected init container. */}}
{{- define "draind.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}
