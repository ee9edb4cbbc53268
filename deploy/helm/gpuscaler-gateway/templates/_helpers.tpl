{{/* Names, labels, the NATS client settings and checks of the values. */}}

{{/* Every object is named after the release (helm install llm-gateway: Service
llm-gateway), so clients reach http://<release>.<namespace>.svc and the gateway's NATS
identity is <namespace>/<release>. */}}
{{- define "gateway.fullname" -}}
{{- .Values.fullnameOverride | default .Release.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gateway.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "gateway.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpuscaler
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "gateway.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: gateway
{{- end }}

{{/* The static gpuscaler image, as gpuscaler's chart names it. */}}
{{- define "gateway.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The NATS URLs: yours, or the Service gpuscaler's chart puts its bundled NATS behind
as release gpuscaler in namespace gpuscaler (<release>-nats, port 4222). */}}
{{- define "gateway.natsURL" -}}
{{- if .Values.nats.url -}}
{{ .Values.nats.url }}
{{- else -}}
{{ if .Values.nats.tls.enabled }}tls{{ else }}nats{{ end }}://gpuscaler-nats.gpuscaler.svc.{{ .Values.clusterDomain }}:4222
{{- end -}}
{{- end }}

{{/* Where the gateway reads its projected ServiceAccount token, its routes, its NATS
credentials and its NATS CA. */}}
{{- define "gateway.natsTokenDir" -}}/var/run/secrets/gpuscaler/nats{{- end }}
{{- define "gateway.routesDir" -}}/etc/gpuscaler-gateway{{- end }}

{{/* The Secret with the shared NATS identity; empty with auth kubernetes or none. */}}
{{- define "gateway.natsAuthSecret" -}}
{{- if not (has .Values.nats.auth.type (list "none" "kubernetes")) -}}
{{ required (printf "nats.auth.secretName is required with nats.auth.type %s: a Secret of namespace %s" .Values.nats.auth.type .Release.Namespace) .Values.nats.auth.secretName }}
{{- end -}}
{{- end }}

{{/* Whole hours, minutes and seconds (30s, 2m, 1m30s: values.schema.json) in seconds. */}}
{{- define "gateway.seconds" -}}
{{- $s := 0 -}}
{{- range $part := regexFindAll "[0-9]+[hms]" . -1 -}}
{{- $n := trimSuffix "h" (trimSuffix "m" (trimSuffix "s" $part)) | int -}}
{{- if hasSuffix "h" $part }}{{ $s = add $s (mul $n 3600) }}{{ else if hasSuffix "m" $part }}{{ $s = add $s (mul $n 60) }}{{ else }}{{ $s = add $s $n }}{{ end -}}
{{- end -}}
{{- $s -}}
{{- end }}

{{/* Values that no schema can check: combinations, and what is unique across routes. */}}
{{- define "gateway.validate" -}}
{{- $names := dict }}
{{- range .Values.routes }}
{{- if hasKey $names .name }}
{{- fail (printf "routes: two routes are named %q: each route's name must be unique (logs and metrics name it)" .name) }}
{{- end }}
{{- $_ := set $names .name true }}
{{- end }}
{{- $pdb := .Values.podDisruptionBudget }}
{{- if and $pdb.enabled (not (kindIs "string" $pdb.minAvailable)) (ge (int $pdb.minAvailable) (int .Values.replicas)) }}
{{- fail (printf "podDisruptionBudget.minAvailable %d with replicas %d would block every node drain: set it below replicas, or podDisruptionBudget.enabled false" (int $pdb.minAvailable) (int .Values.replicas)) }}
{{- end }}
{{- if and .Values.nats.tls.enabled (not .Values.nats.tls.secretName) }}
{{- fail (printf "nats.tls.secretName is required with nats.tls.enabled: a Secret of namespace %s with ca.crt, the CA of the NATS server's certificate" .Release.Namespace) }}
{{- end }}
{{- if and .Values.nats.tls.clientCert (not .Values.nats.tls.enabled) }}
{{- fail "nats.tls.clientCert needs nats.tls.enabled" }}
{{- end }}
{{- if and (has .Values.nats.auth.type (list "token" "userPassword")) (not .Values.nats.tls.enabled) (not .Values.nats.auth.insecureAllowPasswordsWithoutTLS) }}
{{- fail (printf "nats.auth.type %s sends its secret to NATS in the clear, where anyone on the path reads it and becomes that user: set nats.tls.enabled, or accept that with nats.auth.insecureAllowPasswordsWithoutTLS=true" .Values.nats.auth.type) }}
{{- end }}
{{- end }}
