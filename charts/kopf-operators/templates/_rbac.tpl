{{- /* One operator's rules (docs/deploy.md, "Permissions"), split by where they can live. Argument:
dict "ctx" "op" "scope": scope "cluster", the rights its work needs across the cluster (cluster-scoped
objects, or objects in any namespace: Copyrator's copies, Blackadder's targets); "namespaced", the
rights on objects in the namespaces the operator watches (a Role there when watchNamespaces names
them, else in the ClusterRole too). Exactly the calls the operator makes (tests/e2e/test_zz_rbac.py
checks both directions against the API server's audit log). */}}
{{- define "kopf-operators.operatorRules" -}}
{{- $ops := .ctx.Values.operators }}
{{- $cluster := eq .scope "cluster" }}
{{- if eq .op "immortal" }}
{{- if not $cluster }}
# Immortal containers: its CR, and the one pod per CR.
- apiGroups: ["immortalcontainer.flugel.it"]
  resources: ["immortalcontainers"]
  verbs: ["list", "watch"]
- apiGroups: ["immortalcontainer.flugel.it"]
  resources: ["immortalcontainers/status"]
  verbs: ["patch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}
{{- else if eq .op "copyrator" }}
{{- if $cluster }}
# Copyrator: watch sources and copies, list a rule's sources once when it is created, updated or
# resumed, write (JSON patch) and prune copies (only those carrying its marker), and read one object
# only when a create answers 409 or a patch conflicts. Its sources and targets may be any namespace.
- apiGroups: [""]
  resources: ["configmaps", "secrets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
# Events on its rules and on the copies (in their namespaces).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- else }}
# Copyrator: its rules.
- apiGroups: ["flant.com"]
  resources: ["copyrators"]
  verbs: ["list", "watch", "patch"]
- apiGroups: ["flant.com"]
  resources: ["copyrators/status"]
  verbs: ["patch"]
{{- end }}
{{- else if eq .op "blackadder" }}
{{- if $cluster }}
# Blackadder: its agents (cluster-scoped), namespaces and targets in any namespace an agent names.
- apiGroups: ["blackadder.io"]
  resources: ["chaosagents"]
  verbs: ["list", "watch", "patch"]
- apiGroups: ["blackadder.io"]
  resources: ["chaosagents/status"]
  verbs: ["patch"]
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
# Events on the agents (Kopf posts a cluster-scoped object's in namespace default) and the targets.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["list", "get"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["list", "get"]
# Steady-state checks (an agent's spec.steadyState): one read of the workload a check names; with
# spareRollouts, one listing per kind and cycle of the workloads of the Pods it may kill.
- apiGroups: ["apps"]
  resources: ["statefulsets", "daemonsets"]
  verbs: [{{ if $ops.blackadder.spareRollouts }}"list", {{ end }}"get"]
- apiGroups: ["immortalcontainer.flugel.it"]
  resources: ["immortalcontainers"]
  verbs: ["get"]
{{- if not $ops.blackadder.dryRun }}
# The destructive verbs, only when the chart does not force dry-run: delete pods, evict them
# (evictPods: PodDisruptionBudgets apply), scale Deployments, overwrite ConfigMaps.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["delete"]
- apiGroups: [""]
  resources: ["pods/eviction"]
  verbs: ["create"]
- apiGroups: ["apps"]
  resources: ["deployments/scale"]
  verbs: ["patch"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["patch"]
{{- end }}
{{- else }}
# Blackadder: sharedConfigMaps: Skip needs to know which ConfigMaps Copyrator rules copy (an index).
- apiGroups: ["flant.com"]
  resources: ["copyrators"]
  verbs: ["list", "watch"]
{{- if $ops.blackadder.tenants.enabled }}
# Chaos for tenants: TenantChaosAgents (namespaced; each acts only in its own namespace).
- apiGroups: ["blackadder.io"]
  resources: ["tenantchaosagents"]
  verbs: ["list", "watch", "patch"]
- apiGroups: ["blackadder.io"]
  resources: ["tenantchaosagents/status"]
  verbs: ["patch"]
{{- end }}
{{- end }}
{{- else if eq .op "reroller" }}
{{- if not $cluster }}
# Re-roller: hash sources, index workloads, patch their pod template (and baseline annotation);
# a workload is read only after a 409 on its patch. CronJobs get a Job, Jobs are recreated.
- apiGroups: [""]
  resources: ["configmaps", "secrets"]
  verbs: ["list", "watch"]
- apiGroups: ["apps"]
  resources: ["deployments", "statefulsets", "daemonsets"]
  verbs: ["list", "watch", "get", "patch"]
- apiGroups: ["batch"]
  resources: ["cronjobs"]
  verbs: ["list", "watch", "get", "patch"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["list", "watch", "patch", "create", "delete"]
{{- if $ops.reroller.allowRestartActive }}
# CronJob mode restart-active: the pods of a CronJob's unfinished Jobs are deleted (their Jobs replace them).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "delete"]
{{- end }}
{{- if $ops.reroller.history.enabled }}
# History and restore: a source's snapshots are created, listed (by label), pruned and re-ordered
# (metadata), a large source is read, and a restore patches the source.
- apiGroups: [""]
  resources: ["configmaps", "secrets"]
  verbs: ["get", "create", "patch", "delete"]
{{- end }}
{{- if $ops.reroller.argoRollouts }}
- apiGroups: ["argoproj.io"]
  resources: ["rollouts"]
  verbs: ["list", "watch", "get", "patch"]
{{- end }}
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- else if $ops.blackadder.enabled }}
# Re-roller, chaos during a progression: which workloads ChaosAgents (cluster-scoped) disrupt, listed
# read-only from their status when a wave's workload failed (no watch: a Kopf watch of them in another
# process would take Blackadder's finalizer off them).
- apiGroups: ["blackadder.io"]
  resources: ["chaosagents"]
  verbs: ["list"]
{{- end }}
{{- end }}
{{- end -}}

{{- /* What every process needs whatever its operators (Kopf itself): discover the CRDs; list the
namespaces when it watches some namespaces only (Kopf scans them for the ones it serves, names or
globs) or shards. Its Lease: templates/lease.yaml. Argument: dict "ctx". */}}
{{- define "kopf-operators.processRules" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
{{- if or .ctx.Values.sharding.enabled .ctx.Values.watchNamespaces }}
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
{{- end }}
{{- end -}}
