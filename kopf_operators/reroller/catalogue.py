"""The re-roller's Event reasons (on the workload) and the annotations it reads and writes, its own and
stakater Reloader's: one line each. docs/reference/events.md and annotations.md are generated from here
(`make reference`); tests/unit/test_catalogue.py fails when the code emits a reason this list lacks."""

from __future__ import annotations

from kopf_operators.core.catalogue import Catalogue, annotation, label, normal, warning
from kopf_operators.core.conventions import REROLLER_PENDING
from kopf_operators.reroller import settings

WORKLOAD, TEMPLATE = "workload", "workload or its pod template"
SOURCE = "ConfigMap/Secret"

CATALOGUE = Catalogue("reroller", "the workload", events=(
    normal("Rerolled", "the workload was rolled; the message names the source(s) that changed"),
    normal("ChangeNotified", "notify-only (REROLLER_NOTIFY_ONLY): a change was recorded and alerted, nothing rolled"),
    normal("RerollSkipped", "a suspended CronJob: the change became its baseline, no Job was created"),
    normal("RerollDeferred", "a change arrived outside the workload's restart window: pending until it opens"),
    normal("RerollDropped", "a pending change was reverted before its restart window opened: nothing rolls"),
    warning("RerollBlocked", "a malformed restart window or CronJob mode: no rollout (fail closed); the message "
            "names the problem"),
    warning("RerollHalted", "a progressive rollout halted: a workload of an earlier wave failed its rollout; on "
            "each held workload and once per change on the source, naming what failed and how to release it"),
    normal("RerollWaitingForChaos", "on the source: a workload of an earlier wave did not finish its rollout while "
           "a ChaosAgent disrupts it; the waves wait for the disruption to end instead of halting"),
    warning("RolloutSettingInvalid", "a source's rollout, first-wave or wave-deadline annotation cannot be read: "
            "the safe value is used (waves, a first wave of 1, the installation's deadline)"),
    warning("SourceMissing", "a required ConfigMap/Secret does not exist: no rollout until it does "
                             "(once per set of missing sources)"),
    warning("HistoryRefused", "on the ConfigMap/Secret: its history or restore annotation cannot be acted on (not "
            "a count of 1 to 20, an unknown version, history not enabled in the installation); the message says "
            "why (once per reason)"),
    normal("Restored", "on the ConfigMap/Secret: its data were put back to a kept version (restore); its users "
           "roll as for any change"),
    warning("PatternRefused", "a name pattern in a reload annotation is too long or not RE2 syntax (a "
            "backreference, lookaround): it matches nothing; the message says why (once per set of them)"),
), keys=(
    annotation(settings.AUTO, TEMPLATE, "you",
               '"true": roll on every ConfigMap and Secret the pod template references'),
    annotation(settings.CONFIGMAPS, TEMPLATE, "you",
               '"a,b": roll on these ConfigMaps (exact names, referenced or not)'),
    annotation(settings.SECRETS, TEMPLATE, "you", '"x": roll on these Secrets'),
    annotation(settings.USED_KEYS_ONLY, TEMPLATE, "you",
               '"true": roll only when a data key the pod template uses changes'),
    annotation(settings.RELOADER_AUTO, TEMPLATE, "you",
               'Reloader\'s: "true" every referenced source; "false" opts out (also of REROLLER_AUTO_RELOAD_ALL)'),
    annotation(settings.RELOADER_CONFIGMAP_AUTO, TEMPLATE, "you", 'Reloader\'s: "true" every referenced ConfigMap'),
    annotation(settings.RELOADER_SECRET_AUTO, TEMPLATE, "you", 'Reloader\'s: "true" every referenced Secret'),
    annotation(settings.RELOADER_CONFIGMAPS, TEMPLATE, "you",
               "Reloader's: these ConfigMaps (anchored regular expressions), referenced or not"),
    annotation(settings.RELOADER_SECRETS, TEMPLATE, "you",
               "Reloader's: these Secrets (anchored regular expressions), referenced or not"),
    annotation(settings.RELOADER_SEARCH, TEMPLATE, "you", 'Reloader\'s: "true" referenced sources that carry match'),
    annotation(settings.RELOADER_MATCH, SOURCE, "you", 'Reloader\'s: "true" makes the source eligible in search mode'),
    annotation(settings.RELOADER_IGNORE, SOURCE, "you", 'Reloader\'s: "true": the source never rolls anything'),
    annotation(settings.RELOADER_CONFIGMAPS_EXCLUDE, TEMPLATE, "you", "Reloader's: these ConfigMaps never roll it"),
    annotation(settings.RELOADER_SECRETS_EXCLUDE, TEMPLATE, "you", "Reloader's: these Secrets never roll it"),
    annotation(settings.ROLLOUT_STRATEGY, "Argo Rollout", "you",
               'Reloader\'s: "restart" rolls by setting spec.restartAt instead of changing the pod template'),
    annotation(settings.PAUSE_PERIOD, "Deployment", "you",
               'Reloader\'s: "5m": each rollout also pauses the Deployment that long, merging what comes meanwhile'),
    annotation(settings.PAUSED_AT, "Deployment", "operator", "when the pause of pause-period began"),
    annotation(settings.LAST_RELOADED_FROM, "pod template", "operator",
               "Reloader's format: the source that caused the last rollout (workloads opted in with Reloader's keys)"),
    annotation(settings.CONFIG_HASH, "pod template", "operator",
               "the combined hash of the watched data: changing it rolls the workload (our keys)"),
    annotation(settings.OBSERVED_HASH, WORKLOAD, "operator", "the baseline: the combined hash last acted upon"),
    annotation(settings.OBSERVED_SOURCES, WORKLOAD, "operator",
               "JSON of per-source hashes: names the changed source after a restart"),
    annotation(settings.CRONJOB_INSTANTIATE, "Job made from a CronJob", "operator",
               '"manual", as kubectl create job --from=cronjob/... writes it'),
    annotation(settings.RESTART_WINDOW, WORKLOAD, "you",
               'JSON: a time zone and cron windows with durations; changes roll only inside a window'),
    annotation(settings.RELOADER_RESTART_WINDOW, WORKLOAD, "you", "Reloader's restart window, same meaning as ours"),
    annotation(REROLLER_PENDING, WORKLOAD, "operator",
               "a change held for the restart window (or `blocked: ...` when the window cannot be read, "
               "`halted: ...` by a halted progression, `waiting for wave ...` after a halt)"),
    annotation(settings.ROLLOUT, SOURCE, "you",
               '"progressive": its changes roll in waves gated on health; "immediate": all at once'),
    annotation(settings.FIRST_WAVE, SOURCE, "you",
               'the first wave of a progressive rollout: "1" workload or "10%" of the users; each next wave doubles'),
    annotation(settings.WAVE_DEADLINE, SOURCE, "you",
               '"10m": how long a workload of a wave may take to finish its rollout before the rest are held'),
    annotation(settings.RELEASE, SOURCE, "you",
               "the halted change's short hash (named by RerollHalted): its held workloads roll"),
    annotation(settings.WAVE, WORKLOAD, "you",
               '"1": its place in every progression, lower first (default 100); the lowest is the canary'),
    annotation(settings.ROLLED, WORKLOAD, "operator",
               "written with a progressive rollout: the baseline hash and when, for the wave's deadline"),
    annotation(settings.CRONJOB_MODE, "CronJob", "you",
               "run-now (a Job at once), next-run (the template only) or restart-active (the active Jobs' pods)"),
    annotation(settings.HISTORY, SOURCE, "you",
               '"5": keep the last 5 versions of its data as snapshots (1 to 20; REROLLER_HISTORY must be on)'),
    annotation(settings.RESTORE, SOURCE, "you",
               '"<hash>" (or a unique prefix of 7+) or "previous": put that kept version back; removed when done'),
    label(settings.SNAPSHOT_OF, "snapshot (ConfigMap/Secret)", "operator", "the name of the source it is a version of"),
    annotation(settings.SNAPSHOT_HASH, "snapshot (ConfigMap/Secret)", "operator",
               "the data hash of the version it holds"),
    annotation(settings.SNAPSHOT_VERSION, "snapshot (ConfigMap/Secret)", "operator",
               "the source's resourceVersion when this version was last current: orders the history"),
))
