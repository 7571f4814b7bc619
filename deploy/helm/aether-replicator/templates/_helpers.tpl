{{/* Objects' name: <release> if it contains the chart's name, else <release>-<chart>. */}}
{{- define "aether-replicator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/*
"true" when rendering the region-agnostic objects only (no ConfigMap, no peers, no Helm or region labels):
the kustomize base, which deploy/helm/sync.sh renders with kustomizeBase, and `helm lint` without a region
(lint is not a release; install, upgrade and template refuse an empty region).
*/}}
{{- define "aether-replicator.regionless" -}}
{{- if or .Values.kustomizeBase (and (not .Values.region) (not .Release.IsInstall) (not .Release.IsUpgrade)) -}}
true
{{- end -}}
{{- end -}}

{{/* What the schema cannot say; a failed check names the value. */}}
{{- define "aether-replicator.validate" -}}
{{- if not (include "aether-replicator.regionless" .) -}}
{{- if not .Values.region -}}
{{- fail "region: required: this region's name, e.g. --set region=eu-west (deploy/gen-overlays.sh writes a values file per region)" -}}
{{- end -}}
{{- if not .Values.local.endpoints -}}
{{- fail (printf "local.endpoints: required: region %s's etcd client URLs" .Values.region) -}}
{{- end -}}
{{- if not .Values.peers -}}
{{- fail (printf "peers: region %s needs at least one peer region to mirror into" .Values.region) -}}
{{- end -}}
{{- if hasKey .Values.peers .Values.region -}}
{{- fail (printf "peers.%s: region %s cannot be its own peer" .Values.region .Values.region) -}}
{{- end -}}
{{- with .Values.settings.electionTtlSeconds -}}
{{- if gt (mul 2 (int .)) (int $.Values.settings.leaseTtlSeconds) -}}
{{- fail (printf "settings.electionTtlSeconds: %d is more than half of settings.leaseTtlSeconds (%d): a successor must take over before the peers' copies can expire" (int .) (int $.Values.settings.leaseTtlSeconds)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Selects the replicator's pods. */}}
{{- define "aether-replicator.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/component: replicator
{{- if not (include "aether-replicator.regionless" .) }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}
{{- end -}}

{{/*
Every object's labels. The ServiceMonitor turns the pods' aether-replicator/region into the `region` target
label every alert groups by.
*/}}
{{- define "aether-replicator.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/part-of: aether
{{- if not (include "aether-replicator.regionless" .) }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
aether-replicator/region: {{ .Values.region }}
{{- end }}
{{- with .Values.labels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* metadata: name (default <fullname>), labels (and `extra` ones), annotations. */}}
{{- define "aether-replicator.metadata" -}}
name: {{ .name | default (include "aether-replicator.fullname" .root) }}
labels:
  {{- include "aether-replicator.labels" .root | nindent 2 }}
  {{- with .extra }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with .root.Values.annotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "aether-replicator.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* A Secret's name: the value, else <fullname>-<suffix>. */}}
{{- define "aether-replicator.secret" -}}
{{- .name | default (printf "%s-%s" (include "aether-replicator.fullname" .root) .suffix) -}}
{{- end -}}

{{/*
One etcd's projected volume: the TLS Secret's three files and the password, 0440 (the pod's fsGroup reads
them). `etcd` is the local or a peer's values, `kind` "local-etcd" or "peer-P".
*/}}
{{- define "aether-replicator.etcdVolume" -}}
- name: {{ .volume }}
  projected:
    defaultMode: 0440
    sources:
      - secret:
          name: {{ include "aether-replicator.secret" (dict "root" .root "name" .etcd.tlsSecret "suffix" (printf "%s-tls" .volume)) }}
          items:
            - { key: ca.crt, path: ca.crt }
            - { key: tls.crt, path: tls.crt }
            - { key: tls.key, path: tls.key }
      - secret:
          name: {{ include "aether-replicator.secret" (dict "root" .root "name" .etcd.passwordSecret "suffix" (printf "%s-auth" .volume)) }}
          items:
            - { key: password, path: password }
{{- end -}}

{{/* A number from the values (YAML numbers arrive as float64) as an integer, else the value as JSON. */}}
{{- define "aether-replicator.toml" -}}
{{- if kindIs "float64" . -}}
{{- int64 . -}}
{{- else -}}
{{- toJson . -}}
{{- end -}}
{{- end -}}

{{/* The keys of one etcd's table in config.toml, its files under `dir`. */}}
{{- define "aether-replicator.etcdTable" -}}
endpoints = {{ toJson .etcd.endpoints }}
ca = "{{ .dir }}/ca.crt"
cert = "{{ .dir }}/tls.crt"
key = "{{ .dir }}/tls.key"
{{- with .etcd.serverName }}
server_name = {{ toJson . }}
{{- end }}
username = {{ toJson .username }}
password_file = "{{ .dir }}/password"
{{- end -}}

{{/* config.toml: the keys are the long flag names in snake_case, as the binary reads them. */}}
{{- define "aether-replicator.config" -}}
# aether-replicator, region {{ .Values.region }}: written by the Helm chart from its values. The Deployment adds
# --metrics-addr=$(POD_IP):{{ .Values.metricsPort }} and the replica id (the pod name). Secrets come from the
# mounted files only.
region = {{ toJson .Values.region }}
lease_ttl = "{{ int64 .Values.settings.leaseTtlSeconds }}s"
{{- with .Values.settings.electionTtlSeconds }}
election_ttl = "{{ int64 . }}s"
{{- end }}
{{- range $key, $value := omit .Values.settings "leaseTtlSeconds" "electionTtlSeconds" }}
{{- if not (kindIs "invalid" $value) }}
{{ snakecase $key }} = {{ include "aether-replicator.toml" $value }}
{{- end }}
{{- end }}

# Region {{ .Values.region }}'s own etcd.
[local]
{{ include "aether-replicator.etcdTable" (dict "etcd" .Values.local "dir" "/etc/aether/local" "username" .Values.local.username) }}
{{- range $peer, $etcd := .Values.peers }}

# Region {{ $peer }}'s etcd: region {{ $.Values.region }}'s subtree is mirrored there, under a lease only region {{ $.Values.region }} keeps alive.
[peers.{{ $peer }}]
{{ include "aether-replicator.etcdTable" (dict "etcd" $etcd "dir" (printf "/etc/aether/peers/%s" $peer) "username" ($etcd.username | default (printf "aether-replicator-%s" $.Values.region))) }}
{{- with $etcd.maxTxnOps }}
max_txn_ops = {{ include "aether-replicator.toml" . }}
{{- end }}
{{- with $etcd.maxRequestBytes }}
max_request_bytes = {{ include "aether-replicator.toml" . }}
{{- end }}
{{- end }}
{{- end -}}
