{{/* Names, labels and the NATS client settings the scaler and the collectors share. */}}

{{- define "gpuscaler.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's base name: the scaler's Service, so scalerAddress is <fullname>.<namespace>.svc:<grpcPort>. */}}
{{- define "gpuscaler.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "gpuscaler.scaler.name" -}}{{ include "gpuscaler.fullname" . }}{{- end }}
{{- /* Whether the scaler checks node reports against the pods of the Kubernetes API:
scaler.kubernetesAPI, except with collector.source sim, whose pods are made up. */ -}}
{{- define "gpuscaler.scaler.kubernetesAPI" -}}{{ and .Values.scaler.kubernetesAPI (ne .Values.collector.source "sim") }}{{- end }}
{{- /* Whether the collector reads its node's pods from the API ("true" or "false"):
not when the scaler takes pods' labels and requests from its own watch, unless the NVML
source measures each pod's own use of a shared GPU (collector.hostProc), which needs
the pods' UIDs. */ -}}
{{- define "gpuscaler.collector.readPods" -}}
{{- $hostProc := and .Values.collector.hostProc (has .Values.collector.source (list "auto" "nvml")) -}}
{{- or (ne (include "gpuscaler.scaler.kubernetesAPI" .) "true") $hostProc -}}
{{- end }}
{{- define "gpuscaler.collector.name" -}}{{ include "gpuscaler.fullname" . | trunc 53 | trimSuffix "-" }}-collector{{- end }}
{{- define "gpuscaler.nats.name" -}}{{ include "gpuscaler.fullname" . | trunc 58 | trimSuffix "-" }}-nats{{- end }}
{{- define "gpuscaler.authCallout.name" -}}{{ include "gpuscaler.fullname" . | trunc 50 | trimSuffix "-" }}-auth-callout{{- end }}

{{- define "gpuscaler.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "gpuscaler.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpuscaler
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one component: include "gpuscaler.selectorLabels" (list . "scaler") */}}
{{- define "gpuscaler.selectorLabels" -}}
{{- $top := index . 0 -}}
app.kubernetes.io/name: {{ include "gpuscaler.name" $top }}
app.kubernetes.io/instance: {{ $top.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "gpuscaler.componentLabels" -}}
{{ include "gpuscaler.labels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/* The static image: scaler, auth callout. */}}
{{- define "gpuscaler.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The collector's image (cgo): make image builds it as <image.repository>-collector. */}}
{{- define "gpuscaler.collectorImage" -}}
{{ .Values.collector.image.repository | default (printf "%s-collector" .Values.image.repository) }}:{{ .Values.collector.image.tag | default .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The NATS URLs the scaler and the collectors connect to. */}}
{{- define "gpuscaler.natsURL" -}}
{{- if .Values.nats.enabled -}}
{{ if .Values.nats.tls.enabled }}tls{{ else }}nats{{ end }}://{{ include "gpuscaler.nats.name" . }}.{{ .Release.Namespace }}.svc.{{ .Values.clusterDomain }}:4222
{{- else -}}
{{ required "nats.url is required when nats.enabled is false: the scaler and collectors need a NATS with JetStream" .Values.nats.url }}
{{- end -}}
{{- end }}

{{/* The GPUSCALER stream's replicas. */}}
{{- define "gpuscaler.streamReplicas" -}}
{{- if .Values.scaler.streamReplicas -}}
{{ .Values.scaler.streamReplicas }}
{{- else if .Values.nats.enabled -}}
{{ .Values.nats.replicas }}
{{- else -}}
1
{{- end -}}
{{- end }}

{{/* Whether NATS clients authenticate with their ServiceAccount token through the auth callout. */}}
{{- define "gpuscaler.kubernetesAuth" -}}
{{- if eq .Values.nats.auth.type "kubernetes" }}true{{ end }}
{{- end }}

{{/* Where the scaler and the collectors find their projected ServiceAccount token. */}}
{{- define "gpuscaler.natsTokenDir" -}}/var/run/secrets/gpuscaler/nats{{- end }}

{{/* NATS client flags: include "gpuscaler.natsArgs" (list . $auth). $auth false leaves out
the credentials (the auth callout brings its own). */}}
{{- define "gpuscaler.natsArgs" -}}
{{- $top := index . 0 -}}
{{- $auth := index . 1 -}}
- --nats-url={{ include "gpuscaler.natsURL" $top }}
{{- if $auth }}
{{- if eq $top.Values.nats.auth.type "nkey" }}
- --nats-nkey-seed=/etc/gpuscaler/nats-auth/nkey
{{- else if eq $top.Values.nats.auth.type "creds" }}
- --nats-creds=/etc/gpuscaler/nats-auth/creds
{{- else if eq $top.Values.nats.auth.type "kubernetes" }}
- --nats-token-file={{ include "gpuscaler.natsTokenDir" $top }}/token
{{- end }}
{{- end }}
{{- if $top.Values.nats.tls.enabled }}
- --nats-tls-ca=/etc/gpuscaler/nats-tls/ca.crt
{{- if $top.Values.nats.tls.clientCert }}
- --nats-tls-cert=/etc/gpuscaler/nats-tls/tls.crt
- --nats-tls-key=/etc/gpuscaler/nats-tls/tls.key
{{- end }}
{{- end }}
{{- end }}

{{/* NATS secrets passed as environment (not flags, so they stay out of the process list):
include "gpuscaler.natsEnv" (list . $secretName) */}}
{{- define "gpuscaler.natsEnv" -}}
{{- $top := index . 0 -}}
{{- $secret := index . 1 -}}
{{- if eq $top.Values.nats.auth.type "token" }}
- name: GPUSCALER_NATS_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: token
{{- else if eq $top.Values.nats.auth.type "userPassword" }}
- name: GPUSCALER_NATS_USER
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: user
- name: GPUSCALER_NATS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: password
{{- end }}
{{- end }}

{{/* include "gpuscaler.natsVolumeMounts" (list . $auth) */}}
{{- define "gpuscaler.natsVolumeMounts" -}}
{{- $top := index . 0 -}}
{{- $auth := index . 1 -}}
{{- if and $auth (has $top.Values.nats.auth.type (list "nkey" "creds")) }}
- name: nats-auth
  mountPath: /etc/gpuscaler/nats-auth
  readOnly: true
{{- else if and $auth (eq $top.Values.nats.auth.type "kubernetes") }}
- name: nats-token
  mountPath: {{ include "gpuscaler.natsTokenDir" $top }}
  readOnly: true
{{- end }}
{{- if $top.Values.nats.tls.enabled }}
- name: nats-tls
  mountPath: /etc/gpuscaler/nats-tls
  readOnly: true
{{- end }}
{{- end }}

{{/* include "gpuscaler.natsVolumes" (list . $secretName $auth) */}}
{{- define "gpuscaler.natsVolumes" -}}
{{- $top := index . 0 -}}
{{- $secret := index . 1 -}}
{{- $auth := index . 2 -}}
{{- if and $auth (has $top.Values.nats.auth.type (list "nkey" "creds")) }}
- name: nats-auth
  secret:
    secretName: {{ $secret }}
    defaultMode: 0440
    items:
      - key: {{ $top.Values.nats.auth.type }}
        path: {{ $top.Values.nats.auth.type }}
{{- else if and $auth (eq $top.Values.nats.auth.type "kubernetes") }}
# The pod's own identity for NATS: a ServiceAccount token for our audience only (useless
# against the API server), renewed by the kubelet; the client re-reads it on reconnect.
- name: nats-token
  projected:
    sources:
      - serviceAccountToken:
          audience: {{ $top.Values.nats.auth.kubernetes.audience }}
          expirationSeconds: {{ int $top.Values.nats.auth.kubernetes.tokenExpirationSeconds }}
          path: token
{{- end }}
{{- if $top.Values.nats.tls.enabled }}
- name: nats-tls
  secret:
    secretName: {{ required "nats.tls.secretName is required when nats.tls.enabled is true" $top.Values.nats.tls.secretName }}
    defaultMode: 0440
{{- end }}
{{- end }}

{{/* The Secret with the scaler's NATS credentials; empty when auth.type is none or kubernetes. */}}
{{- define "gpuscaler.natsAuthSecret" -}}
{{- if not (has .Values.nats.auth.type (list "none" "kubernetes")) -}}
{{ required (printf "nats.auth.secretName is required with nats.auth.type %s" .Values.nats.auth.type) .Values.nats.auth.secretName }}
{{- end -}}
{{- end }}

{{- define "gpuscaler.collectorNatsAuthSecret" -}}
{{- if not (has .Values.nats.auth.type (list "none" "kubernetes")) -}}
{{ .Values.nats.auth.collectorSecretName | default (include "gpuscaler.natsAuthSecret" .) }}
{{- end -}}
{{- end }}

{{/* The Secret with the callout's issuer seed and NATS password: yours, or the chart's. */}}
{{- define "gpuscaler.authCallout.secretName" -}}
{{ .Values.nats.auth.kubernetes.secretName | default (include "gpuscaler.authCallout.name" .) }}
{{- end }}

{{/* The Secret with the bundled NATS cluster's route password (key route-password): yours, or the chart's. */}}
{{- define "gpuscaler.nats.routeSecretName" -}}
{{ .Values.nats.cluster.secretName | default (printf "%s-routes" (include "gpuscaler.nats.name" .)) }}
{{- end }}

{{/* The Secret with the routes' TLS certificate (tls.crt, tls.key, ca.crt); empty: plain routes. */}}
{{- define "gpuscaler.nats.routeTLSSecret" -}}
{{- if .Values.nats.cluster.tlsSecretName -}}
{{ .Values.nats.cluster.tlsSecretName }}
{{- else if .Values.nats.tls.enabled -}}
{{ .Values.nats.tls.serverSecretName }}
{{- end -}}
{{- end }}

{{/* The ConfigMap the callout writes its issuer's public key to (key issuer.pub), which the
bundled NATS servers read: they never see the seed. */}}
{{- define "gpuscaler.authCallout.issuerConfigMap" -}}{{ include "gpuscaler.authCallout.name" . }}-issuer{{- end }}

{{/* The ServiceAccounts the callout treats as the scaler and as collectors: namespace/name. */}}
{{- define "gpuscaler.scalerIdentity" -}}{{ .Release.Namespace }}/{{ include "gpuscaler.scaler.name" . }}{{- end }}
{{- define "gpuscaler.collectorIdentity" -}}
{{- if .Values.collector.enabled }}{{ .Release.Namespace }}/{{ include "gpuscaler.collector.name" . }}{{ end }}
{{- end }}

{{/* The DNS names the scaler's certificate is valid for: every form of its Service's name
a scalerAddress may use. */}}
{{- define "gpuscaler.scalerDNSNames" -}}
{{- $svc := include "gpuscaler.scaler.name" . -}}
{{- $ns := .Release.Namespace -}}
{{- list (printf "%s.%s.svc.%s" $svc $ns .Values.clusterDomain) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s" $svc $ns) $svc | toJson -}}
{{- end }}

{{/* Where the scaler's gRPC certificates come from: existing (scaler.tls.secretName),
certManager or generated (by Helm, kept with lookup). */}}
{{- define "gpuscaler.grpcTLSSource" -}}
{{- $cm := .Values.scaler.tls.certManager.enabled -}}
{{- if .Values.scaler.tls.secretName -}}
existing
{{- else if or (eq (toString $cm) "true") (and (eq (toString $cm) "auto") (.Capabilities.APIVersions.Has "cert-manager.io/v1")) -}}
certManager
{{- else -}}
generated
{{- end -}}
{{- end }}

{{/* The Secret the scaler reads tls.crt, tls.key and ca.crt from. */}}
{{- define "gpuscaler.grpcTLSSecret" -}}
{{ .Values.scaler.tls.secretName | default (printf "%s-grpc-tls" (include "gpuscaler.fullname" .)) }}
{{- end }}

{{/* The Secret, in keda.namespace, with KEDA's client certificate. */}}
{{- define "gpuscaler.kedaClientSecret" -}}
{{ .Values.keda.clusterTriggerAuthentication.secretName | default (printf "%s-keda-client-tls" (include "gpuscaler.fullname" .)) }}
{{- end }}

{{/* With cert-manager (gpuscaler.grpcTLSSource certManager): the server CA's key pair,
in the release's namespace, and its certificate alone in keda.namespace; the client CA's
key pair, in keda.namespace, and its certificate alone in the release's namespace. */}}
{{- define "gpuscaler.grpcServerCA" -}}
{{ include "gpuscaler.fullname" . }}-grpc-server-ca
{{- end }}
{{- define "gpuscaler.grpcServerCACert" -}}
{{ include "gpuscaler.fullname" . }}-grpc-server-ca-cert
{{- end }}
{{- define "gpuscaler.grpcClientCA" -}}
{{ include "gpuscaler.fullname" . }}-grpc-client-ca
{{- end }}
{{- define "gpuscaler.grpcClientCACert" -}}
{{ include "gpuscaler.fullname" . }}-grpc-client-ca-cert
{{- end }}

{{/* A CA key pair kept across upgrades, as JSON {"crt", "key"} (base64 PEM): the one in
Secret (list $ namespace name commonName) if it holds both, else a new one (genCA,
scaler.tls.validityDays). */}}
{{- define "gpuscaler.keptCA" -}}
{{- $ := index . 0 }}
{{- $data := (lookup "v1" "Secret" (index . 1) (index . 2)).data | default dict }}
{{- $crt := index $data "tls.crt" | default "" }}
{{- $key := index $data "tls.key" | default "" }}
{{- if not (and $crt $key) }}
{{- $ca := genCA (index . 3) (int $.Values.scaler.tls.validityDays) }}
{{- $crt = $ca.Cert | b64enc }}
{{- $key = $ca.Key | b64enc }}
{{- end }}
{{- dict "crt" $crt "key" $key | toJson }}
{{- end }}

{{/* A control-plane pod's affinity: include "gpuscaler.controlPlaneAffinity" (list .
$affinity). The component's own affinity, with, unless it sets nodeAffinity itself, a
required rule keeping the pod off the nodes avoidGPUNodes names. */}}
{{- define "gpuscaler.controlPlaneAffinity" -}}
{{- $top := index . 0 -}}
{{- $aff := deepCopy (index . 1 | default dict) -}}
{{- $avoid := $top.Values.avoidGPUNodes -}}
{{- if and $avoid.key (not (hasKey $aff "nodeAffinity")) -}}
{{- $expr := dict "key" $avoid.key "operator" "NotIn" "values" $avoid.values -}}
{{- $_ := set $aff "nodeAffinity" (dict "requiredDuringSchedulingIgnoredDuringExecution" (dict "nodeSelectorTerms" (list (dict "matchExpressions" (list $expr))))) -}}
{{- end -}}
{{- with $aff -}}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end -}}
{{- end }}

{{/* Values that no schema can check: combinations. */}}
{{- define "gpuscaler.validate" -}}
{{- if and .Values.nats.enabled (has .Values.nats.auth.type (list "nkey" "creds")) }}
{{- fail (printf "nats.auth.type %s needs an operator-mode NATS: use your own NATS (nats.enabled=false, nats.url), or kubernetes, token or userPassword with the bundled one" .Values.nats.auth.type) }}
{{- end }}
{{- if and .Values.nats.enabled .Values.nats.auth.collectorSecretName }}
{{- fail "nats.auth.collectorSecretName needs your own NATS: the bundled one has a single identity, nats.auth.secretName" }}
{{- end }}
{{- if and (eq .Values.nats.auth.type "kubernetes") .Values.nats.auth.collectorSecretName }}
{{- fail "nats.auth.collectorSecretName is for a shared secret (token, userPassword, nkey, creds): with nats.auth.type kubernetes every collector has its own identity already" }}
{{- end }}
{{- if and (eq .Values.nats.auth.type "kubernetes") (not .Values.nats.enabled) (not .Values.nats.auth.kubernetes.secretName) }}
{{- fail "nats.auth.kubernetes.secretName is required with your own NATS (nats.enabled=false) and nats.auth.type kubernetes: your server's auth_callout names the issuer's public key, so the issuer seed (and the callout's password) must be yours (deploy/README.md)" }}
{{- end }}
{{- if and .Values.nats.enabled .Values.nats.tls.enabled (not .Values.nats.tls.serverSecretName) }}
{{- fail "nats.tls.serverSecretName is required when the bundled NATS serves TLS (nats.enabled and nats.tls.enabled)" }}
{{- end }}
{{- if and .Values.scaler.statusPage (not (and .Values.networkPolicy.enabled .Values.networkPolicy.metricsFrom)) }}
{{- fail "scaler.statusPage shows every namespace's triggers, queues and pods to whoever reaches scaler.httpPort: it needs networkPolicy.enabled with networkPolicy.metricsFrom naming who may (kubectl port-forward reaches it whatever the policy)" }}
{{- end }}
{{- $auth := .Values.nats.auth }}
{{- $passwords := "" }}
{{- if has $auth.type (list "token" "userPassword") }}
{{- $passwords = printf "nats.auth.type %s sends its secret" $auth.type }}
{{- else if and (eq $auth.type "kubernetes") $auth.kubernetes.staticUsersSecretName }}
{{- $passwords = "nats.auth.kubernetes.staticUsersSecretName's users send their passwords" }}
{{- end }}
{{- if and $passwords (not .Values.nats.tls.enabled) (not $auth.insecureAllowPasswordsWithoutTLS) }}
{{- fail (printf "%s to NATS in the clear, where anyone on the path reads it and becomes that user: set nats.tls.enabled (deploy/README.md), or accept that with nats.auth.insecureAllowPasswordsWithoutTLS=true" $passwords) }}
{{- end }}
{{- if and .Values.nats.enabled (eq (int .Values.nats.replicas) 2) }}
{{- fail "nats.replicas 2 cannot survive losing one server (JetStream needs a majority): use 1, 3 or 5" }}
{{- end }}
{{- $cta := .Values.keda.clusterTriggerAuthentication }}
{{- if and $cta.enabled (not .Values.scaler.tls.enabled) }}
{{- fail "keda.clusterTriggerAuthentication.enabled needs scaler.tls.enabled: KEDA would speak TLS to a scaler serving plain gRPC (set both to false, and remove authenticationRef from your triggers)" }}
{{- end }}
{{- if and .Values.scaler.tls.enabled $cta.enabled .Values.scaler.tls.secretName (not $cta.secretName) }}
{{- fail "keda.clusterTriggerAuthentication.secretName is required with scaler.tls.secretName: the chart makes KEDA's client certificate only with a CA of its own" }}
{{- end }}
{{- if and .Values.scaler.tls.enabled $cta.enabled $cta.secretName (not .Values.scaler.tls.secretName) }}
{{- fail "scaler.tls.secretName is required with keda.clusterTriggerAuthentication.secretName: a client certificate of yours is not signed by the CA the chart makes for the scaler" }}
{{- end }}
{{- end }}

{{/* A size such as 256Mi or 8Gi (or plain bytes) in bytes, for the NATS configuration. */}}
{{- define "gpuscaler.bytes" -}}
{{- $s := . | toString -}}
{{- if or (kindIs "float64" .) (kindIs "int" .) (kindIs "int64" .) -}}
{{- $s = . | int64 | toString -}}
{{- end -}}
{{- $units := dict "" 1 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 -}}
{{- $n := regexFind "^[0-9]+" $s -}}
{{- $unit := trimPrefix $n $s -}}
{{- if or (not $n) (not (hasKey $units $unit)) -}}
{{- fail (printf "%q is not a size: want a whole number with an optional Ki, Mi, Gi or Ti" $s) -}}
{{- end -}}
{{- mul (int64 $n) (index $units $unit) -}}
{{- end }}
