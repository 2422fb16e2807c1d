"""Where a failed nightly gate goes: always a line in a local alert file, and a webhook when configured.

Offline (no webhook, W&B offline) the alert file and the command's non-zero exit status are what reach
someone (a cron mail, a CI job, a shell); online the same JSON is POSTed to the URL in the environment
variable ``nightly.alert_webhook_env`` names (a Slack/Teams incoming webhook, an alert manager, any HTTP
receiver: the body has Slack's ``text`` field and the structured fields beside it). The URL is a secret,
so it lives in the environment, never in params.yaml. A webhook that cannot be reached is logged and
recorded in the alert file's line; it never hides the failed gate.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components.evaluation.config import NightlyConfig

log = logging.getLogger(__name__)


def alert_payload(title: str, summary: Mapping[str, Any]) -> dict[str, Any]:
    """The alert's JSON: ``text`` (one readable message) and the nightly's summary fields."""
    failures = list(summary.get("failures", []))
    text = f"{title}\n" + "\n".join(f"- {f}" for f in failures)
    return {
        "text": text.strip(),
        "title": title,
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        **{
            k: summary[k]
            for k in ("verdict", "checkpoint", "baseline", "failures", "diff_table")
            if k in summary
        },
    }


def post_webhook(url: str, payload: Mapping[str, Any], timeout_s: float) -> str:
    """POST the payload as JSON; returns what happened (``sent (HTTP 200)`` or ``failed: ...``)."""
    request = urllib.request.Request(
        url,
        data=json.dumps(payload).encode("utf-8"),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return f"sent (HTTP {response.status})"
    except (urllib.error.URLError, OSError, ValueError) as err:
        log.warning("nightly alert webhook %s failed: %s", _redacted(url), err)
        return f"failed: {err}"


def _redacted(url: str) -> str:
    """A webhook URL without its path (where incoming webhooks keep their secret)."""
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}/…"


def deliver_alert(cfg: NightlyConfig, title: str, summary: Mapping[str, Any]) -> dict[str, str]:
    """Write the alert to ``cfg.alert_file`` (JSON Lines, appended) and POST it to the configured webhook.
    Returns ``{"alert_file": path, "webhook": what happened}``."""
    payload = alert_payload(title, summary)
    url = os.environ.get(cfg.alert_webhook_env, "").strip() if cfg.alert_webhook_env else ""
    webhook = post_webhook(url, payload, cfg.alert_timeout_s) if url else "not configured"
    path = Path(cfg.alert_file)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps({**payload, "webhook": webhook}) + "\n")
    return {"alert_file": str(path), "webhook": webhook}
