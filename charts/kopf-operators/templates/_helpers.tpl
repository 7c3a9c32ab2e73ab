{{- /* The chart's name in object names and the app.kubernetes.io/name label (nameOverride). */}}
{{- define "kopf-operators.name" -}}{{ default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}{{- end -}}

{{- /* The prefix of every object's name: fullnameOverride, else "<release>-<name>" (the release's name
alone when it already contains the chart's). */}}
{{- define "kopf-operators.fullname" -}}
{{- if .Values.fullnameOverride -}}{{ .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else -}}
{{- $name := include "kopf-operators.name" . -}}
{{- if contains $name .Release.Name -}}{{ .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else -}}{{ printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kopf-operators.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kopf-operators.selector" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "kopf-operators.selector" -}}
app.kubernetes.io/name: {{ include "kopf-operators.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kopf-operators.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}{{ default (include "kopf-operators.fullname" .) .Values.serviceAccount.name }}
{{- else -}}{{ default "default" .Values.serviceAccount.name }}{{- end -}}
{{- end -}}

{{- /* The Lease the replicas elect a holder on: per process (deploymentMode perOperator: "-<operator>"
added) and per shard ("-shard-N" added). */}}
{{- define "kopf-operators.leaseName" -}}{{ include "kopf-operators.fullname" . }}{{- end -}}

{{- /* The enabled operators, as a JSON list (fromJsonArray). */}}
{{- define "kopf-operators.enabledOperators" -}}
{{- $enabled := list }}
{{- range $name := list "immortal" "copyrator" "blackadder" "reroller" }}
{{- if (index $.Values.operators $name).enabled }}{{ $enabled = append $enabled $name }}{{ end }}
{{- end }}
{{- if not $enabled }}{{ fail "enable at least one operator in .Values.operators" }}{{ end }}
{{- toJson $enabled }}
{{- end -}}

{{- /* The processes of the release, each with a ServiceAccount of its own (a JSON list of units):
deploymentMode bundle, one unit running every enabled operator (suffix ""); perOperator, one unit per
enabled operator (suffix "-<operator>"), each bound only to that operator's rights. */}}
{{- define "kopf-operators.units" -}}
{{- $enabled := include "kopf-operators.enabledOperators" . | fromJsonArray }}
{{- $units := list }}
{{- if eq .Values.deploymentMode "perOperator" }}
{{- range $enabled }}{{ $units = append $units (dict "suffix" (printf "-%s" .) "operator" . "operators" (list .)) }}{{ end }}
{{- else }}
{{- $units = list (dict "suffix" "" "operator" "" "operators" $enabled) }}
{{- end }}
{{- toJson $units }}
{{- end -}}

{{- /* A unit's ServiceAccount: the bundle's is serviceAccountName; perOperator: <that base>-<operator>
(the base: serviceAccount.name, else the release's fullname). Argument: dict "ctx" "unit". */}}
{{- define "kopf-operators.unitServiceAccount" -}}
{{- if .unit.operator -}}{{ printf "%s-%s" (default (include "kopf-operators.fullname" .ctx) .ctx.Values.serviceAccount.name) .unit.operator }}
{{- else -}}{{ include "kopf-operators.serviceAccountName" .ctx }}{{- end -}}
{{- end -}}

{{- /* A unit's selector labels beyond the release's: its operator (perOperator) and its shard.
Argument: dict "unit" "shard" (shard "" when unsharded). */}}
{{- define "kopf-operators.unitSelector" -}}
{{- if .unit.operator }}
kopf-operators.dev/operator: {{ .unit.operator }}
{{- end }}
{{- if .shard }}
app.kubernetes.io/component: shard-{{ .shard }}
{{- end }}
{{- end -}}

{{- /* The shards of a unit: [""] unsharded. Blackadder's ChaosAgents are cluster-scoped: its own unit
(perOperator) is never sharded; in the bundle it runs in shard 0. Argument: dict "ctx" "unit". */}}
{{- define "kopf-operators.unitShards" -}}
{{- $shards := list "" }}
{{- if and .ctx.Values.sharding.enabled (ne .unit.operator "blackadder") }}
{{- $shards = list }}{{ range until (int .ctx.Values.sharding.shards) }}{{ $shards = append $shards (toString .) }}{{ end }}
{{- end }}
{{- toJson $shards }}
{{- end -}}

{{- /* Whether the namespaced rights come from Roles in the watched namespaces: watchNamespaces set,
every entry a plain name (a glob names no namespace a Role could be created in). */}}
{{- define "kopf-operators.namespacedRoles" -}}
{{- $plain := true }}
{{- range .Values.watchNamespaces }}{{ if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" .) }}{{ $plain = false }}{{ end }}{{ end }}
{{- if and .Values.watchNamespaces $plain }}true{{ end }}
{{- end -}}
