{{- /* Helpers of the monitoring, network-policy and pod-extras templates (docs/observability.md). */}}

{{- /* The series of this release in PromQL: what the ServiceMonitor/PodMonitor relabelings produce. */}}
{{- define "kopf-operators.seriesSelector" -}}
{{- if .Values.prometheusRule.selector -}}{{ .Values.prometheusRule.selector }}
{{- else -}}job="{{ include "kopf-operators.fullname" . }}",namespace="{{ .Release.Namespace }}"{{- end -}}
{{- end -}}

{{- /* Relabelings shared by the ServiceMonitor and the PodMonitor: a fixed job name (so alerts and the
dashboard find this release whichever monitor scrapes it), the shard index (sharding.enabled) and, in
deploymentMode perOperator, the operator a pod runs (`process`: the series' own `operator` label is
the operator a sample counts for). */}}
{{- define "kopf-operators.scrapeRelabelings" -}}
- action: replace
  targetLabel: job
  replacement: {{ include "kopf-operators.fullname" . }}
- action: replace
  sourceLabels: [__meta_kubernetes_pod_label_app_kubernetes_io_component]
  regex: shard-(.+)
  targetLabel: shard
  replacement: $1
- action: replace
  sourceLabels: [__meta_kubernetes_pod_label_kopf_operators_dev_operator]
  regex: (.+)
  targetLabel: process
  replacement: $1
{{- end -}}

{{- /* Pod extras: metadata. */}}
{{- define "kopf-operators.podLabels" -}}
{{- range $key, $_ := .Values.podLabels }}
{{- if has $key (list "app.kubernetes.io/name" "app.kubernetes.io/instance" "app.kubernetes.io/component" "kopf-operators.dev/operator") }}
{{- fail (printf "podLabels: %q is the chart's own selector label; choose another key" $key) }}
{{- end }}
{{- end }}
{{- with .Values.podLabels }}{{ toYaml . }}{{ end }}
{{- end -}}

{{- /* Pod extras: spec fields. */}}
{{- define "kopf-operators.podSpecExtras" -}}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- /* extraEnv after the chart's variables; a name the chart sets itself is refused (the later one
would silently win). `$chartEnv` is the list of names the Deployment sets. */}}
{{- define "kopf-operators.extraEnv" -}}
{{- $chartEnv := list "OPERATOR_NAMESPACE" "OPERATOR_POD_NAME" "LEADER_ELECTION" "LEASE_NAME" "POD_NAMESPACE" "SHARD_INDEX" "SHARD_COUNT" "CHAOS_DRY_RUN" "CHAOS_STOP_ALL" "CHAOS_MAX_ADDED_REPLICAS" "CHAOS_WEBHOOK_HOSTS" "CHAOS_CHECK_HOSTS" "CHAOS_PROMETHEUS_URL" "CHAOS_TENANTS" "CHAOS_TENANTS_MAX_KILLS_PER_CYCLE" "CHAOS_TENANTS_MIN_PAUSE_SECONDS" "CHAOS_TENANT_HTTP_HOSTS" "CHAOS_TENANTS_MAX_CHECKS" "CHAOS_TENANTS_MAX_CHECK_TIMEOUT_SECONDS" "CHAOS_TENANTS_MIN_CHECK_INTERVAL_SECONDS" "CHAOS_TENANTS_MAX_AGENTS_PER_NAMESPACE" "COPYRATOR_ALLOW_CROSS_NAMESPACE" "COPYRATOR_RESYNC_SECONDS" "COPYRATOR_PUSH" "COPYRATOR_TRUSTED_NAMESPACES" "COPYRATOR_OPEN_NAMESPACES" "COPYRATOR_RULES_NEED_TARGET_CONSENT" "COPYRATOR_MAX_SOURCE_BYTES" "REROLLER_DEBOUNCE_SECONDS" "REROLLER_MIN_INTERVAL_SECONDS" "REROLLER_CLUSTER_ROLLOUTS_PER_SECOND" "REROLLER_CLUSTER_BURST" "REROLLER_RESYNC_SECONDS" "REROLLER_AUTO_RELOAD_ALL" "REROLLER_RELOAD_ON_CREATE" "REROLLER_RELOAD_ON_DELETE" "REROLLER_NAMESPACES_TO_IGNORE" "REROLLER_NAMESPACE_SELECTOR" "REROLLER_RESOURCE_LABEL_SELECTOR" "REROLLER_RESOURCES_TO_IGNORE" "REROLLER_IGNORED_WORKLOAD_TYPES" "REROLLER_RELOAD_STRATEGY" "REROLLER_CRONJOB_MODE" "REROLLER_ALLOW_RESTART_ACTIVE" "REROLLER_SYNC_AFTER_RESTART" "REROLLER_HISTORY" "REROLLER_CHAOS_AWARE" "CHAOS_SPARE_ROLLOUTS" "REROLLER_ROLLOUT" "REROLLER_FIRST_WAVE" "REROLLER_WAVE_DEADLINE_SECONDS" "REROLLER_ARGO_ROLLOUTS" "REROLLER_METRICS_BY_NAMESPACE" "REROLLER_NOTIFY_ONLY" "REROLLER_ALERT_SINK" "REROLLER_ALERT_WEBHOOK_URL" "REROLLER_ALERT_ADDITIONAL_INFO" "METRICS_PORT" "CONCURRENT_EVENTS" }}
{{- range .Values.extraEnv }}
{{- if has .name $chartEnv }}
{{- fail (printf "extraEnv: %s is set by the chart from its values (see values.yaml); set that value instead" .name) }}
{{- end }}
{{- end }}
{{- with .Values.extraEnv }}{{ toYaml . }}{{ end }}
{{- end -}}
