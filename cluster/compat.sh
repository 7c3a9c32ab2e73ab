#!/usr/bin/env bash
# `make compat [MINOR=1.35]`: the compatibility subset of the end-to-end suite against each supported
# Kubernetes minor (versions.env's COMPAT_VERSIONS; MINOR picks one, "all" or empty: every one), one
# minor at a time, each on a cluster of its own (CLUSTER_DIR=<repo>/.cluster-compat/<minor>) with the
# machine's real node (root, REAL_NODE=1: containerd and that minor's own kubelet, node.sh), built by
# build.sh into a cache folder of its own, started fresh and stopped after (cluster.sh down removes the
# node's processes and host state; a process left behind fails the minor). The API server runs as
# managed clusters run it: without the alpha ShardedListAndWatch gate (the shards filter in the process).
#
# Every minor's outcome is recorded in .compat/<version> (date, commit, whether the tree had
# uncommitted changes, result, the tests' summary line); `make release` refuses to publish unless every
# minor passed on the commit it releases, from a clean tree (docs/releasing.md).
#
# The subset (COMPAT_TESTS below, ~10-15 minutes a minor on 2 cores): each operator's main path and its
# schema's CEL rules; on the real node, the chart installed as a pod serving all four operators, the
# immortal's pods replaced and Blackadder's recovery timed by the kubelet, the chart upgraded to a new
# tag and from an older release with live objects; HA with the chart's two replicas (one acts, takeover
# on SIGKILL and on SIGTERM) and twins on the Lease; the status conventions (kstatus); sharding. A
# skipped test fails the minor. CI runs the whole suite on the pinned minor (KUBERNETES_VERSION in
# versions.env).
#
# `make compat-upgrade` (compat.sh upgrade): a live cluster upgraded across minors, from the pinned
# release to the next supported one (tests/e2e/test_upgrade_minor.py), on a cluster of its own
# (<repo>/.cluster-compat/upgrade) with the machine's real node (root, REAL_NODE=1), started fresh and
# stopped after; recorded in .compat/upgrade-<from>-<to>.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
cd "$repo"
# shellcheck source=versions.env
source "$here/versions.env"
log() { echo "[compat $(date +%T)] $*" >&2; }

COMPAT_TESTS=(
  tests/e2e/test_immortal.py::test_article_yaml_runs_a_pod_and_reports_it
  tests/e2e/test_immortal.py::test_deleted_pod_is_recreated_and_counted_exactly_once
  tests/e2e/test_immortal.py::test_bad_input_is_rejected_with_a_readable_message
  tests/e2e/test_immortal.py::test_overlong_name_is_rejected
  tests/e2e/test_immortal.py::test_image_change_replaces_the_pod
  tests/e2e/test_copyrator.py::test_article_rule_copies_into_every_namespace_and_propagates
  tests/e2e/test_copyrator.py::test_schema_rejects_bad_rules_readably
  tests/e2e/test_copyrator.py::test_secret_rule_skips_tokens_and_never_leaks_values
  tests/e2e/test_copyrator.py::test_every_prune_path
  tests/e2e/test_reroller.py::test_nginx_configmap_change_rolls_once
  tests/e2e/test_reroller.py::test_secret_change_rolls_once_and_never_leaks
  tests/e2e/test_reroller.py::test_statefulset_and_daemonset_roll_once
  tests/e2e/test_reroller.py::test_cronjob_gets_a_job_and_job_is_recreated
  tests/e2e/test_blackadder.py::test_eagerness_over_100_is_rejected_and_columns_show_the_spec
  tests/e2e/test_blackadder.py::test_tantrum_kills_only_in_targets_and_respects_tolerance
  tests/e2e/test_blackadder.py::test_cancer_and_ipsum_confined_live_edit_and_revert
  tests/e2e/test_blackadder.py::test_bad_guard_fields_are_rejected_with_a_readable_message
  tests/e2e/test_chart.py::test_helm_install_is_accepted_by_the_api_server
  tests/e2e/test_deploy.py::test_chart_lints_and_the_api_server_accepts_it
  # The real node: the chart's pod, each operator in it, a chart upgrade (a new tag; an older release
  # with live objects of all four operators).
  tests/e2e/test_real_node.py::test_operator_pod_runs_on_the_real_node_and_stays_ready
  tests/e2e/test_real_node.py::test_in_cluster_operator_serves_all_four_operators
  tests/e2e/test_real_node.py::test_helm_upgrade_to_a_new_tag_recreates_the_pod
  tests/e2e/test_immortal_real_node.py::test_pods_taken_away_are_replaced_at_once_and_counted_once
  tests/e2e/test_blackadder_real_node.py::test_the_reported_time_to_recover_matches_the_pods_timestamps
  tests/e2e/test_upgrade.py::test_helm_upgrade_from_the_base_commit_keeps_every_object_and_acts
  # HA: the chart's two replicas on the real node, and twins on the Lease.
  tests/e2e/test_ha.py::test_two_replicas_on_the_lease_one_acts_the_standby_writes_nothing
  tests/e2e/test_ha.py::test_sigkill_of_the_holder_the_standby_acts_within_the_lease_duration_nothing_twice
  tests/e2e/test_ha.py::test_sigterm_of_the_holder_hands_over_at_once
  tests/e2e/test_ha.py::test_twins_started_at_the_same_instant_act_once
  tests/e2e/test_status.py::test_an_object_the_operator_has_not_observed_yet_is_in_progress
  tests/e2e/test_status.py::test_immortal_container_states
  tests/e2e/test_status.py::test_copyrator_rule_states
  tests/e2e/test_status.py::test_chaos_agent_states
  tests/e2e/test_sharding.py
)

record() { # FILE VERSION COMMIT DIRTY RESULT SECONDS SUMMARY
  printf 'version=%s\ndate=%s\ncommit=%s\nuncommitted_changes=%s\nresult=%s\nseconds=%s\nsummary=%s\n' \
    "$2" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$3" "$4" "$5" "$6" "$7" > "$1"
}

# After `cluster.sh down`: no kubelet, containerd or shim of $CLUSTER_DIR's node still runs, and the
# machine's real node is free again (the next minor, or CI, takes it).
node_gone() {
  local left
  left=$(pgrep -af "$CLUSTER_DIR/(node|kwok)" || true)
  [ -z "$left" ] && [ ! -s /run/kopf-operators-real-node ] && [ ! -d "$CLUSTER_DIR/node" ] && return 0
  log "left behind by $CLUSTER_DIR: ${left:-no process}; owner file: $(cat /run/kopf-operators-real-node 2>/dev/null)"
  return 1
}

upgrade() {
  local from to started=$SECONDS result=failed summary="the cluster did not start" out commit dirty
  from=$KUBERNETES_VERSION
  to=$(echo "$COMPAT_VERSIONS" | tr ' ' '\n' | grep -A1 -x "$from" | sed -n 2p)
  [ -n "$to" ] || { log "no supported minor after $from ($COMPAT_VERSIONS)"; exit 2; }
  export CLUSTER_DIR=$repo/.cluster-compat/upgrade REAL_NODE=1 KUBE_FEATURE_GATES=${KUBE_FEATURE_GATES-}
  commit=$(git rev-parse HEAD)
  dirty=no; [ -z "$(git status --porcelain)" ] || dirty=yes
  mkdir -p .compat
  log "upgrade $from -> $to: building both (if needed), starting $CLUSTER_DIR fresh with the real node"
  # A leftover of an interrupted run is stopped first; a stop that fails fails the run (said above).
  if "$here/cluster.sh" down >&2 && "$here/build.sh" >/dev/null && KUBERNETES_VERSION=$to "$here/build.sh" >/dev/null \
      && "$here/cluster.sh" up; then
    out=$(mktemp)
    if "$repo/.venv/bin/pytest" -p no:cacheprovider -q -rA -m upgrade tests/e2e/test_upgrade_minor.py 2>&1 \
        | tee "$out" >&2; then
      result=passed
    fi
    summary=$(grep -E '(passed|failed|error)' "$out" | tail -1)
    if [ "$result" = passed ] && ! grep -q '1 passed' <<<"$summary"; then result=failed; fi
    rm -f "$out"
  fi
  if ! "$here/cluster.sh" down; then result=failed summary="$summary; cluster.sh down failed"; fi
  record ".compat/upgrade-$from-$to" "$from->$to" "$commit" "$dirty" "$result" "$((SECONDS - started))" "$summary"
  log "upgrade $from -> $to: $result ($summary) in $((SECONDS - started))s; recorded in .compat/upgrade-$from-$to"
  [ "$result" = passed ]
}

if [ "${1:-}" = upgrade ]; then upgrade; exit; fi

wanted=${1:-all}
versions=()
for v in $COMPAT_VERSIONS; do
  minor=${v#v}; minor=${minor%.*}
  if [ "$wanted" = all ] || [ "$wanted" = "$minor" ] || [ "$wanted" = "$v" ]; then versions+=("$v"); fi
done
[ ${#versions[@]} -gt 0 ] || { log "no supported minor $wanted (one of: $COMPAT_VERSIONS, or all)"; exit 2; }

mkdir -p .compat
failed=0
for v in "${versions[@]}"; do
  minor=${v#v}; minor=${minor%.*}
  export KUBERNETES_VERSION=$v CLUSTER_DIR=$repo/.cluster-compat/$minor REAL_NODE=1
  export KUBE_FEATURE_GATES=${KUBE_FEATURE_GATES-}  # no alpha gate, as a managed cluster
  commit=$(git rev-parse HEAD)
  dirty=no; [ -z "$(git status --porcelain)" ] || dirty=yes
  log "Kubernetes $v: building (if needed) and starting $CLUSTER_DIR fresh with the real node"
  started=$SECONDS
  result=failed summary="the cluster did not start"
  # A leftover of an interrupted run is stopped first; a stop that fails fails the minor (said above).
  if "$here/cluster.sh" down >&2 && "$here/build.sh" >/dev/null && "$here/cluster.sh" up; then
    out=$(mktemp)
    if "$repo/.venv/bin/pytest" -p no:cacheprovider -q -rs --durations=25 "${COMPAT_TESTS[@]}" 2>&1 \
        | tee "$out" >&2; then
      result=passed
    fi
    summary=$(grep -E '(passed|failed|error)' "$out" | tail -1)
    # Every test of the subset can run here: a skipped one is not a pass.
    if [ "$result" = passed ] && grep -q 'skipped' <<<"$summary"; then result=failed; fi
    rm -f "$out"
  fi
  if ! "$here/cluster.sh" down; then result=failed summary="$summary; cluster.sh down failed"; fi
  if ! node_gone; then result=failed summary="$summary; the real node left processes or host state behind"; fi
  record ".compat/$v" "$v" "$commit" "$dirty" "$result" "$((SECONDS - started))" "$summary"
  log "Kubernetes $v: $result ($summary) in $((SECONDS - started))s; recorded in .compat/$v"
  [ "$result" = passed ] || failed=1
done
exit $failed
