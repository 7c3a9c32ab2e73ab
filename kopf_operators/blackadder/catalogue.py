"""Blackadder's Event reasons (on the agent, and on its target with the agent's name appended) and the
labels and annotations it reads and writes: one line each. docs/reference/events.md and annotations.md
are generated from here (`make reference`); tests/unit/test_catalogue.py fails when the code emits a
reason this list lacks."""

from __future__ import annotations

from kopf_operators.blackadder import settings
from kopf_operators.core.catalogue import Catalogue, annotation, label, normal, warning

ON = ("the ChaosAgent or TenantChaosAgent (a ChaosAgent's land in `default`), and on its target with the agent's "
      "name appended")
CATALOGUE = Catalogue("blackadder", ON, events=(
    normal("PodKilled", "a Pod was deleted or evicted (tantrum)"),
    normal("DeploymentScaled", "a Deployment was scaled up (cancer)"),
    normal("ConfigMapIpsumed", "a ConfigMap's values were overwritten with lorem ipsum (ipsum)"),
    normal("RolloutsSpared", "workloads in the middle of a rollout, or with a change the re-roller holds, were "
           "left alone (CHAOS_SPARE_ROLLOUTS); said when their number changes"),
    normal("EvictionRefused", "the API server refused an eviction (a PodDisruptionBudget): the Pod lives"),
    normal("Reverted", "a change of the ledger was restored"),
    warning("SteadyStateBroken", "a steady-state check failed failureThreshold times in a row: the run halted "
            "(and reverted unless revertOnHalt is false); the message names the check and its last answer"),
    normal("DurationElapsed", "the run's spec.duration elapsed: the agent reverted and reports Finished"),
    normal("MaxActionsReached", "the run took spec.maxActions actions: the agent reverted and reports Finished"),
    normal("WouldKillPod", "dry run: the Pod a real cycle would kill"),
    normal("WouldScaleDeployment", "dry run: the Deployment a real cycle would scale"),
    normal("WouldIpsumConfigMap", "dry run: the ConfigMap a real cycle would overwrite"),
    normal("WouldRevert", "dry run: what a revert would restore"),
    warning("RevertSkipped", "a change was not restored: the object was edited since, or is gone"),
    warning("RevertFailed", "a restore failed; the next cycle retries it"),
    warning("RevertRefused", "a ledger entry names a namespace the agent may not target now (or one on the "
                             "deny-list): nothing is written there, the entry is dropped"),
    warning("RevertAbandoned", "a revert kept failing: the agent let go of its ledger, which stays for an "
                               "administrator"),
    warning("LedgerFull", "the ledger Secret is full: a ConfigMap is not overwritten, since its undo would not fit"),
    warning("LedgerTaken", "the agent was deleted while its ledger's name is taken by another Secret: no revert, "
                           "the Secret untouched"),
    warning("CycleFailed", "a cycle failed (the API error, or a ledger Secret that is not ours: not written by "
                           "the operator for this agent, or a Copyrator copy)"),
    warning("InvalidSpec", "the spec cannot be used (a bad time zone, window or regular expression, a check URL "
                           "with credentials; a TenantChaosAgent outside an allowed namespace or over the "
                           "administrator's limits): the agent idles, its checks too, until it is fixed"),
    warning("WebhookRefused", "the webhook address is refused: not an http(s) URL, credentials in it (user@ or "
                              "user:password@), or a host not in CHAOS_WEBHOOK_HOSTS"),
    warning("WebhookFailed", "a webhook POST, or reading its Secret, failed"),
    warning("WebhookSecretMissing", "the Secret naming the webhook URL does not exist"),
), keys=(
    label(settings.OPT_LABEL, "Pod, Deployment, ConfigMap", "you",
          '"false" always opts the object out; with requireOptIn only "true" makes it a candidate'),
    label(settings.KILL_SWITCH_LABEL, "the operator's Namespace", "you",
          '"true" stops every agent within seconds (the global kill switch)'),
    label(settings.MTBF_LABEL, "Pod (put it in the pod template)", "you",
          "the workload's own mean time between failures (after kube-monkey's mtbf)"),
    label(settings.KILL_MODE_LABEL, "Pod (put it in the pod template)", "you",
          "how many of the workload's Pods one kill takes: fixed, kill-all, random-max-percent, fixed-percent"),
    label(settings.KILL_VALUE_LABEL, "Pod (put it in the pod template)", "you",
          "the number or percentage for kill-mode"),
    label(settings.TENANT_NAMESPACE_LABEL, "Namespace", "you",
          f'"{settings.TENANT_NAMESPACE_VALUE}": TenantChaosAgents in this namespace may act'),
    label(settings.LEDGER_LABEL, "ledger Secret", "operator", "marks the Secret as an agent's ledger"),
    annotation(settings.LEDGER_AGENT_ANNOTATION, "ledger Secret", "operator", "the full name of the ledger's agent"),
    annotation(settings.LEDGER_ABANDONED_ANNOTATION, "ledger Secret", "operator",
               "set when the operator let go of the ledger (a revert that kept failing); left for an administrator"),
    label(settings.TENANT_LEDGER_UID_LABEL, "tenant ledger Secret", "operator",
          "the uid of the TenantChaosAgent the ledger belongs to"),
))
