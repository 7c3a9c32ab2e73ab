"""Re-roller alerts: each sink's payload, the options, and that the URL never shows."""

from __future__ import annotations

import pytest

from kopf_operators.reroller.alerts import Alert, AlertSettings, payload

ALERT = Alert("Deployment", "web", "nginx", ("configmap/nginx-conf",), "rolled",
              "Re-rolled Deployment nginx: data changed in configmap/nginx-conf")


def test_payload_per_sink() -> None:
    text = "prod : Re-rolled Deployment nginx: data changed in configmap/nginx-conf (namespace web)"
    assert payload("slack", ALERT, "prod") == {"attachments": [{"text": text, "color": "good",
                                                                 "author_name": "re-roller"}]}
    assert payload("teams", ALERT, "prod") == {"text": text}
    assert payload("gchat", ALERT, "prod") == {"text": text}
    assert payload("webhook", ALERT) == {
        "kind": "Deployment", "namespace": "web", "name": "nginx", "sources": ["configmap/nginx-conf"],
        "action": "rolled", "message": text.removeprefix("prod : ")}


def test_settings_from_env() -> None:
    assert not AlertSettings.from_env({}).sink
    url = "https://hooks.example.invalid/services/T000/B000/secret-token"
    settings = AlertSettings.from_env({"REROLLER_ALERT_SINK": "Slack", "REROLLER_ALERT_WEBHOOK_URL": url,
                                       "REROLLER_NOTIFY_ONLY": "true"})
    assert settings.sink == "slack" and settings.notify_only and settings.url == url
    assert "secret-token" not in repr(settings)
    # The one boolean parser, as every other boolean variable: 1, yes and on say true too.
    assert AlertSettings.from_env({"REROLLER_ALERT_SINK": "slack", "REROLLER_ALERT_WEBHOOK_URL": url,
                                   "REROLLER_NOTIFY_ONLY": "1"}).notify_only
    for env, error in [({"REROLLER_ALERT_SINK": "webex", "REROLLER_ALERT_WEBHOOK_URL": url}, "not one of"),
                       ({"REROLLER_ALERT_SINK": "slack"}, "REROLLER_ALERT_WEBHOOK_URL"),
                       ({"REROLLER_NOTIFY_ONLY": "true"}, "needs REROLLER_ALERT_SINK")]:
        with pytest.raises(ValueError, match=error) as caught:
            AlertSettings.from_env(env)
        assert "secret-token" not in str(caught.value)
