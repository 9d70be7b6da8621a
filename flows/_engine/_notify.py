"""Tell people when a campaign waits, stops, fails or recovers: a webhook and email.

Why here and not Prefect's notification blocks or automations: the events are the
engine's (a policy blocked round 3, an approval waits for alice with this deadline),
they must reach people for campaigns run without Prefect too, and a delivery must
never touch the campaign. So this is stdlib ``smtplib`` and one ``httpx`` POST,
called from the engine's event hook, and a delivery that fails is logged and
recorded, never raised.

Every delivery attempt is a line of ``notifications.jsonl`` in the campaign's
directory (kind, channel, ``sent`` or ``failed`` with the error's type). The same
notice is sent once: a flow that runs again from the top after a resume replays
its suspend event, and the journal's ``sent`` lines stop a second message.
Messages carry names, rounds, codes and links, never proposal content or secrets.
"""

from __future__ import annotations

import json
import logging
import os
import smtplib
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import httpx

from flows._paths import append_private
from tasks import NotifyConfig

log = logging.getLogger("unattended.notify")

# Engine event -> notice kind (``stopped`` splits by the run's status).
_KINDS = {"suspend": "suspend", "failed": "failed", "recovered": "recovered"}


class Notifier:
    """Deliver a campaign's notices to its webhook and mailboxes; record every attempt.

    Args:
        config: Where to send, and which events.
        campaign: The campaign's name.
        journal: The JSON-lines file of delivery attempts (and the once-only memory).
        run_link: Returns the flow run's UI link and its id (None without Prefect).
    """

    def __init__(
        self,
        config: NotifyConfig,
        campaign: str,
        journal: Path,
        run_link: Callable[[], tuple[str, str] | None] = lambda: None,
    ) -> None:
        self.config = config
        self.campaign = campaign
        self.journal = journal
        self.run_link = run_link
        self._lock = threading.Lock()

    def on_event(self, kind: str, data: Mapping[str, Any]) -> None:
        """Turn an engine event into a notice when it is one of the configured kinds."""
        notice = kind
        if kind == "stopped":
            notice = str(data.get("status"))
        elif kind not in _KINDS:
            return
        if notice not in self.config.events:
            return
        key = self._key(notice, data)
        self.send(key, notice, self._text(notice, data))

    def send(self, key: str, kind: str, text: str) -> None:
        """Deliver ``text`` on every channel not yet sent for ``key``; never raise."""
        done = self._sent_channels(key)
        channels: list[tuple[str, Callable[[str, str], None]]] = []
        if self.config.webhook_url is not None:
            channels.append(("webhook", self._post))
        if self.config.email_to:
            channels.append(("email", self._mail))
        for channel, deliver in channels:
            if channel in done:
                continue
            try:
                deliver(kind, text)
            except Exception as exc:  # noqa: BLE001  # a notice must never fail the campaign
                log.warning("notification %s via %s failed: %s", kind, channel, type(exc).__name__)
                self._record(key, kind, channel, "failed", type(exc).__name__)
            else:
                self._record(key, kind, channel, "sent", None)

    def _post(self, kind: str, text: str) -> None:
        assert self.config.webhook_url is not None
        response = httpx.post(
            self.config.webhook_url.get_secret_value(),
            json={"text": text},
            timeout=self.config.timeout_seconds,
        )
        response.raise_for_status()

    def _mail(self, kind: str, text: str) -> None:
        message = EmailMessage()
        message["Subject"] = text.splitlines()[0]
        message["From"] = self.config.email_from
        message["To"] = ", ".join(self.config.email_to)
        message.set_content(text)
        with smtplib.SMTP(
            self.config.smtp_host, self.config.smtp_port, timeout=self.config.timeout_seconds
        ) as smtp:
            smtp.send_message(message)

    def _key(self, notice: str, data: Mapping[str, Any]) -> str:
        # One suspend notice per form (pause key); one stop, failure or recovery per round.
        detail = data.get("key") or data.get("round")
        return f"{self.campaign}:{notice}:{detail}"

    def _text(self, notice: str, data: Mapping[str, Any]) -> str:
        name = self.campaign
        at = f"round {data.get('round')}"
        code = data.get("code")
        if notice == "suspend":
            lines = [f"[unattended] campaign {name} waits for approval ({at})"]
            rule = data.get("rule")
            if rule:
                lines.append(f"rule: {rule}; approvers: {', '.join(data.get('approvers', ()))}")
            if data.get("deadline"):
                lines.append(f"answer by {data['deadline']} (UTC)")
            link = self.run_link()
            if link is not None:
                url, run_id = link
                lines.append(f"UI: {url}  (menu > Resume)")
                lines.append(f"CLI: unattended approve {run_id} --as NAME [--reject]")
            return "\n".join(lines)
        if notice == "recovered":
            return (
                f"[unattended] campaign {name} recovered: it continues from {at} after a "
                "restart; nothing done before is repeated"
            )
        verb = {"blocked": "was blocked", "escalated": "escalated", "failed": "failed"}[notice]
        return f"[unattended] campaign {name} {verb} in {at} ({code or 'no code'})"

    def _sent_channels(self, key: str) -> set[str]:
        try:
            lines = self.journal.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return set()
        sent = set()
        for line in lines:
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a line cut short by a crash
            if entry.get("key") == key and entry.get("status") == "sent":
                sent.add(entry.get("channel"))
        return sent

    def _record(self, key: str, kind: str, channel: str, status: str, error: str | None) -> None:
        entry = {
            "at": datetime.now(UTC).isoformat(timespec="seconds"),
            "key": key,
            "kind": kind,
            "channel": channel,
            "status": status,
            "error": error,
        }
        try:
            with (
                self._lock,
                os.fdopen(append_private(self.journal), "a", encoding="utf-8") as handle,
            ):
                handle.write(json.dumps(entry) + "\n")
                # Durable like the provenance (synchronous=FULL): after a power cut a notice
                # recorded as sent is not sent twice.
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as exc:  # a full disk must not fail the campaign either
            log.warning("cannot record a notification: %s", type(exc).__name__)


def chain(
    *hooks: Callable[[str, Mapping[str, Any]], None],
) -> Callable[[str, Mapping[str, Any]], None]:
    """Return one event hook that calls each of ``hooks`` in turn."""

    def on_event(kind: str, data: Mapping[str, Any]) -> None:
        for hook in hooks:
            hook(kind, data)

    return on_event
