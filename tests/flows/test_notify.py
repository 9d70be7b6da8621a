"""Notifications: each event kind reaches a real webhook and a real SMTP server; failures never
fail the campaign."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest

from flows._engine._direct import run_direct
from flows._engine._notify import Notifier
from flows._provenance import ProvenanceStore
from tasks import NotifyConfig


def closed_port() -> int:
    """Return a port on 127.0.0.1 that nothing listens on (a receiver that is down)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "demo"

EVENTS: dict[str, tuple[str, dict[str, Any], str]] = {
    "suspend": (
        "suspend",
        {
            "round": 2,
            "key": "c-r2-c1-n0",
            "rule": "review-round-2",
            "approvers": ["alice", "bob"],
            "deadline": "2026-12-01T13:00:00+00:00",
        },
        "campaign c waits for approval (round 2)",
    ),
    "blocked": (
        "stopped",
        {"round": 3, "status": "blocked", "code": "policy_denied"},
        "campaign c was blocked in round 3 (policy_denied)",
    ),
    "escalated": (
        "stopped",
        {"round": 1, "status": "escalated", "code": "policy_denied"},
        "campaign c escalated in round 1 (policy_denied)",
    ),
    "failed": ("failed", {"round": 0, "code": "internal"}, "campaign c failed in round 0"),
    "recovered": ("recovered", {"round": 2}, "campaign c recovered: it continues from round 2"),
}


def _config(webhook_url: str, smtp_port: int) -> NotifyConfig:
    return NotifyConfig(
        webhook_url=webhook_url,
        email_to=["alice@example.org"],
        smtp_port=smtp_port,
        timeout_seconds=5,
    )


def _journal(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


class TestEachKind:
    @pytest.mark.parametrize("kind", list(EVENTS))
    def test_reaches_the_webhook_and_the_mailbox(
        self, kind: str, webhook: Any, mailbox: Any, tmp_path: Path
    ) -> None:
        event, data, expected = EVENTS[kind]
        link = ("http://127.0.0.1:4200/v2/runs/flow-run/r1", "r1")
        notifier = Notifier(
            _config(webhook.url, mailbox.port), "c", tmp_path / "n.jsonl", lambda: link
        )
        notifier.on_event(event, data)
        assert len(webhook.posts) == 1
        assert set(webhook.posts[0]) == {"text"}  # Slack and Mattermost read "text"
        assert expected in webhook.posts[0]["text"]
        assert len(mailbox.messages) == 1
        assert expected in mailbox.messages[0]["Subject"]
        assert mailbox.messages[0]["To"] == "alice@example.org"
        assert [e["status"] for e in _journal(tmp_path / "n.jsonl")] == ["sent", "sent"]

    def test_a_suspend_notice_carries_the_ui_link_and_the_cli_command(
        self, webhook: Any, tmp_path: Path
    ) -> None:
        link = ("http://127.0.0.1:4200/v2/runs/flow-run/r1", "r1")
        config = NotifyConfig(webhook_url=webhook.url)
        Notifier(config, "c", tmp_path / "n.jsonl", lambda: link).on_event(*EVENTS["suspend"][:2])
        text = webhook.posts[0]["text"]
        assert "UI: http://127.0.0.1:4200/v2/runs/flow-run/r1" in text
        assert "CLI: unattended approve r1 --as NAME [--reject]" in text
        assert "approvers: alice, bob" in text

    def test_the_same_notice_is_sent_once_when_a_flow_replays_its_event(
        self, webhook: Any, tmp_path: Path
    ) -> None:
        notifier = Notifier(NotifyConfig(webhook_url=webhook.url), "c", tmp_path / "n.jsonl")
        for _ in range(2):
            notifier.on_event(*EVENTS["suspend"][:2])
        assert len(webhook.posts) == 1

    def test_events_not_chosen_are_not_sent(self, webhook: Any, tmp_path: Path) -> None:
        config = NotifyConfig(webhook_url=webhook.url, events=["failed"])
        Notifier(config, "c", tmp_path / "n.jsonl").on_event(*EVENTS["blocked"][:2])
        assert webhook.posts == []


class TestReceiversDown:
    def test_a_failed_delivery_is_recorded_not_raised(self, tmp_path: Path) -> None:
        down = closed_port()
        notifier = Notifier(
            _config(f"http://127.0.0.1:{down}/hook", down), "c", tmp_path / "n.jsonl"
        )
        notifier.on_event(*EVENTS["failed"][:2])
        entries = _journal(tmp_path / "n.jsonl")
        assert [(e["channel"], e["status"]) for e in entries] == [
            ("webhook", "failed"),
            ("email", "failed"),
        ]
        assert entries[0]["error"] == "ConnectError"
        assert entries[1]["error"] == "ConnectionRefusedError"


def _campaign(tmp_path: Path, name: str, rule: str, notify: str) -> Path:
    """Copy the demo as a 2-round campaign whose policy has one extra rule."""
    for item in EXAMPLES.iterdir():
        shutil.copy(item, tmp_path / item.name)
    policy = tmp_path / "policy.toml"
    policy.write_text(policy.read_text() + rule)
    spec = tmp_path / "campaign.toml"
    text = spec.read_text().replace('name = "demo"', f'name = "{name}"')
    spec.write_text(text.replace("rounds = 4", "rounds = 2") + notify)
    return spec


BLOCK_ROUND_1 = """
[[rules]]
name = "stop-at-1"
severity = "HARD_STOP"
when = "round.index == 1"
"""


def _notify_table(webhook_url: str, smtp_port: int) -> str:
    return (
        f'\n[notify]\nwebhook_url = "{webhook_url}"\nemail_to = ["ops@example.org"]\n'
        f"smtp_port = {smtp_port}\ntimeout_seconds = 5\n"
    )


class TestFromTheEngine:
    def test_a_blocked_campaign_notifies_then_a_recovery_does(
        self, webhook: Any, mailbox: Any, tmp_path: Path
    ) -> None:
        spec = _campaign(tmp_path, "nb", BLOCK_ROUND_1, _notify_table(webhook.url, mailbox.port))
        home = tmp_path / "home"
        result = asyncio.run(run_direct(spec, state_dir=home, env={}))
        assert (result.status, result.error_code) == ("blocked", "policy_denied")
        assert [p["text"] for p in webhook.posts] == [
            "[unattended] campaign nb was blocked in round 1 (policy_denied)"
        ]
        assert mailbox.messages[0]["Subject"] == webhook.posts[0]["text"]

        # A crash recorded the campaign as failed; started again, it says it recovers.
        with ProvenanceStore.open(home / "campaigns" / "nb") as store:
            store.set_campaign_status("nb", "failed", "internal")
        asyncio.run(run_direct(spec, state_dir=home, env={}))
        assert "campaign nb recovered: it continues from round 1" in webhook.posts[1]["text"]

    def test_with_every_receiver_down_the_campaign_ends_as_it_would(self, tmp_path: Path) -> None:
        down = closed_port()
        notify = _notify_table(f"http://127.0.0.1:{down}/hook", down)
        spec = _campaign(tmp_path, "nd", BLOCK_ROUND_1, notify)
        result = asyncio.run(run_direct(spec, state_dir=tmp_path / "home", env={}))
        assert (result.status, result.error_code) == ("blocked", "policy_denied")
        journal = _journal(tmp_path / "home" / "campaigns" / "nd" / "notifications.jsonl")
        assert {(e["kind"], e["status"]) for e in journal} == {("blocked", "failed")}
