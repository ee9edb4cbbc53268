{{/* The bundled NATS server's configuration; its checksum restarts the servers on a change. */}}
{{- define "gpuscaler.natsConf" -}}
{{- $name := include "gpuscaler.nats.name" . }}
{{- $replicas := int .Values.nats.replicas -}}
server_name: $POD_NAME
port: 4222
http_port: 8222
pid_file: /var/run/nats/nats.pid
# Finish in-flight work and hand clients to another server before stopping.
lame_duck_duration: 30s
lame_duck_grace_period: 10s
jetstream {
  store_dir: /data
  max_memory_store: {{ include "gpuscaler.bytes" .Values.nats.jetstream.maxMemoryStore }}
  max_file_store: {{ include "gpuscaler.bytes" .Values.nats.jetstream.maxFileStore }}
}
{{- if gt $replicas 1 }}
{{- if not (include "gpuscaler.nats.routeSecretName" .) }}
{{- fail "nats.replicas above 1 needs authenticated routes: a route is trusted with every account's messages, so set nats.cluster.secretName or leave it empty for the chart to generate one" }}
{{- end }}
{{- $routeTLS := include "gpuscaler.nats.routeTLSSecret" . }}
# A route is trusted with every account's messages: a server admits one only with the
# route password ($NATS_ROUTE_PASSWORD){{ if $routeTLS }}, over TLS with a certificate the routes' CA signed{{ end }}.
# $NATS_ROUTE_<i> is server i's route URL with that password in it, which the
# StatefulSet composes, since a variable cannot stand inside a URL here.
cluster {
  name: {{ $name }}
  port: 6222
  authorization {
    user: route
    password: $NATS_ROUTE_PASSWORD
  }
  routes: [
    {{- range $i := until $replicas }}
    $NATS_ROUTE_{{ $i }}
    {{- end }}
  ]
  {{- if $routeTLS }}
  tls {
    cert_file: /etc/nats/route-tls/tls.crt
    key_file: /etc/nats/route-tls/tls.key
    ca_file: /etc/nats/route-tls/ca.crt
    verify: true
  }
  {{- end }}
}
{{- end }}
{{- if .Values.nats.tls.enabled }}
tls {
  cert_file: /etc/nats/tls/tls.crt
  key_file: /etc/nats/tls/tls.key
  ca_file: /etc/nats/tls/ca.crt
  verify: {{ .Values.nats.tls.verifyClients }}
}
{{- end }}
{{- if eq .Values.nats.auth.type "token" }}
authorization {
  token: $NATS_TOKEN
}
{{- else if eq .Values.nats.auth.type "userPassword" }}
authorization {
  user: $NATS_USER
  password: $NATS_PASSWORD
}
{{- else if eq .Values.nats.auth.type "kubernetes" }}
{{- $limits := .Values.nats.auth.kubernetes.limits }}
{{- $tenants := .Values.nats.auth.kubernetes.jetStreamNamespaces | default list }}
# Every client but the callout is authenticated by the auth callout: the server sends it
# the client's connect options (its ServiceAccount token), and admits the client as the
# user the callout answers with, which must be signed by the issuer. $CALLOUT_ISSUER is
# the issuer's public key, which the callout publishes (the server never sees the seed);
# $CALLOUT_PASSWORD is the callout's own login.
# Each role has an account of its own (authcallout.NATSConfig writes the same): the
# scaler's holds the GPUSCALER stream and exports the report subjects as services, the
# collectors' and the producers' import theirs. A reply a client names then routes back
# to its own account only, so the stream's ack can never be stored over another
# subject's report.
accounts {
  # The callout's own account: it may only answer auth requests.
  AUTH {
    users: [
      { user: callout, password: $CALLOUT_PASSWORD }
    ]
  }
  # The scaler: the reports and the GPUSCALER stream.
  GPUSCALER {
    jetstream: enabled
    exports: [
      { service: "gpuscaler.v1.queue.>", accounts: [ GPUSCALER_PRODUCERS{{ range $tenants }}, {{ printf "GPUSCALER_NS_%s" . | quote }}{{ end }} ] }
      { service: "gpuscaler.v1.node.>", accounts: [ GPUSCALER_COLLECTORS ] }
    ]
    {{- if $tenants }}
    # The consumer info of each namespace's own account, under gpuscaler.ns.<ns>.$JS.API:
    # what the scaler reads of their work queues, and nothing else.
    imports: [
      {{- range $tenants }}
      { service: { account: {{ printf "GPUSCALER_NS_%s" . | quote }}, subject: "$JS.API.CONSUMER.INFO.>" }, to: {{ printf "gpuscaler.ns.%s.$JS.API.CONSUMER.INFO.>" . | quote }} }
      {{- end }}
    ]
    {{- end }}
  }
  GPUSCALER_PRODUCERS {
    imports: [ { service: { account: GPUSCALER, subject: "gpuscaler.v1.queue.>" } } ]
    {{- with $limits.producers }}
    limits { max_connections: {{ int .maxConnections }}, max_subscriptions: {{ int .maxSubscriptions }}, max_payload: {{ int .maxPayload }} }
    {{- end }}
  }
  GPUSCALER_COLLECTORS {
    imports: [ { service: { account: GPUSCALER, subject: "gpuscaler.v1.node.>" } } ]
    {{- with $limits.collectors }}
    limits { max_connections: {{ int .maxConnections }}, max_subscriptions: {{ int .maxSubscriptions }}, max_payload: {{ int .maxPayload }} }
    {{- end }}
  }
  {{- $tjs := .Values.nats.auth.kubernetes.tenantJetStream }}
  {{- range $tenants }}
  # Namespace {{ . }}'s own account (jetStreamNamespaces): anything inside it, JetStream
  # included; it imports its own queue subjects alone, and exports its consumer info to
  # the scaler's.
  {{ printf "GPUSCALER_NS_%s" . | quote }} {
    jetstream { max_memory: {{ include "gpuscaler.bytes" $tjs.maxMemoryStore }}, max_file: {{ include "gpuscaler.bytes" $tjs.maxFileStore }}, max_streams: {{ int $tjs.maxStreams }}, max_consumers: {{ int $tjs.maxConsumers }} }
    imports: [ { service: { account: GPUSCALER, subject: {{ printf "gpuscaler.v1.queue.%s.*.*" . | quote }} } } ]
    exports: [ { service: "$JS.API.CONSUMER.INFO.>", accounts: [ GPUSCALER ] } ]
    {{- with $limits.tenants }}
    limits { max_connections: {{ int .maxConnections }}, max_subscriptions: {{ int .maxSubscriptions }}, max_payload: {{ int .maxPayload }} }
    {{- end }}
  }
  {{- end }}
  SYS {}
}
system_account: SYS
authorization {
  auth_callout {
    issuer: $CALLOUT_ISSUER
    auth_users: [ callout ]
    account: AUTH
  }
}
{{- end }}
{{- end }}
