"""Copyrator: the target claims (what each rule wants at a place, and which rule gets a free name)."""

from __future__ import annotations

from typing import Any

from kopf_operators.copyrator import copies, rules
from kopf_operators.copyrator.places import Places
from kopf_operators.copyrator.sources import Sources


class Claims:
    """What a rule wants at each place, from the sources and the namespaces; between rules that want
    one free name, the older one gets it."""

    def __init__(self, options: rules.Options, sources: Sources, places: Places) -> None:
        self.options, self.sources, self.places = options, sources, places

    def desired(self, rule: rules.Rule, name: str,
                ns: rules.NamespaceInfo | None) -> tuple[dict[str, Any] | None, bool]:
        """What the rule wants at ``ns``/``name``, and whether it is blocked from writing there (a
        source it cannot copy as configured: whatever is there stays)."""
        if ns is None or not rules.is_target(rule, ns, self.options.by_name_only):
            return None, False
        source, problem = self.sources.source_for(rule, name)
        if problem:
            return None, True
        if source is None or not rules.allowed_into(rule, source, ns.name, self.options):
            return None, False
        if rules.target_refusal(rule, ns, self.options) is not None:
            return None, True  # the target does not consent: nothing new, and a copy from before stays
        if rules.is_lean(source):
            return None, True  # held without its data: read first (``unread``), whatever is there stays
        return copies.desired_copy(rule, source, ns.name), False

    def unread(self, rule: rules.Rule, name: str, namespace: str) -> dict[str, Any] | None:
        """The source held without its data (``Sources.entry``) that the rule would copy to this place
        now that the target accepts it: to read before deciding (None: nothing to read)."""
        ns = self.sources.namespace(namespace)
        if ns is None or not rules.is_target(rule, ns, self.options.by_name_only):
            return None
        source, problem = self.sources.source_for(rule, name)
        if source is None or problem or not rules.is_lean(source) \
                or not rules.allowed_into(rule, source, ns.name, self.options) \
                or rules.target_refusal(rule, ns, self.options) is not None:
            return None
        return source

    def wants(self, rule: rules.Rule, kind: str, namespace: str, name: str) -> bool:
        """Whether ``rule`` would copy something to this place (as ``desired``, without building it)."""
        ns = self.sources.namespace(namespace)
        if rule.kind != kind or ns is None or not rules.is_target(rule, ns, self.options.by_name_only) \
                or rules.target_refusal(rule, ns, self.options) is not None:
            return False
        source, problem = self.sources.source_for(rule, name)
        return source is not None and not problem and rules.allowed_into(rule, source, namespace, self.options)

    def claimed(self, rule: rules.Rule, kind: str, namespace: str, name: str) -> rules.Rule | None:
        """Another rule that gets this free target name before ``rule`` (the older one), if any."""
        others = [r for _s, r in self.sources.active_rules(kind)
                  if r.uid != rule.uid and self.wants(r, kind, namespace, name)]
        first = rules.first_claim([rule, *others])
        return first if first is not None and first.uid != rule.uid else None

    def superseded_pending(self, rule: rules.Rule, view: copies.CopyView) -> bool:
        """An unwanted copy of ``rule`` whose source the rule now copies under another name into the
        same namespace, and that new copy is not in sync yet: the old one stays until it is."""
        source_ns, _, source_name = view.source.partition("/")
        source = self.sources.winner(rule, source_name)
        ns = self.sources.namespace(view.namespace)
        if source is None or source["metadata"].get("namespace") != source_ns or ns is None:
            return False
        new_name = rules.copy_name(rule, source_name)
        if new_name == view.name:
            return False
        desired, _blocked = self.desired(rule, new_name, ns)
        if desired is None:
            return False
        replacement = self.places.copy(rule.kind, view.namespace, new_name)
        return not (replacement is not None and replacement.rule_uid == rule.uid
                    and copies.in_sync(replacement, desired))
