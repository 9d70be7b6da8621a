"""Notifications: each event kind reaches a real webhook and a real SMTP server, directly and
through Apprise URLs (``json://``, ``mailto://``); once per channel; failures never fail the
campaign; a URL's secrets stay out of the journal, the logs, the provenance and ``check``."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from flows._cli import main
from flows._engine._direct import run_direct
from flows._engine._notify import Notifier, channels, secret_parts
from flows._masking import channel_name
from flows._provenance import ProvenanceStore
from tasks import NotifyConfig


def closed_port() -> int:
    """Return a port on 127.0.0.1 that nothing listens on (a receiver that is down)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "demo"

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
        # Apprise reports only that a delivery failed; why is in its (masked) warning log.
        assert [e["error"] for e in entries] == ["not_delivered", "not_delivered"]


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


# -- Apprise URLs ([notify] urls): json:// to the HTTP receiver, mailto:// to the SMTP server --

SECRET_USER, SECRET_PASSWORD, SECRET_TOKEN = "s3cr3tuser", "s3cr3tpassword", "T0KEN-abcdef123"


def json_url(webhook: Any, *, secret: bool = False) -> str:
    """Return the Apprise ``json://`` URL of the test's HTTP receiver (with secrets if asked)."""
    address = webhook.url.removeprefix("http://").split("/", 1)[0]
    if secret:
        return f"json://{SECRET_USER}:{SECRET_PASSWORD}@{address}/hooks/{SECRET_TOKEN}"
    return f"json://{address}/hooks/apprise"


def mailto_url(mailbox: Any) -> str:
    return (
        f"mailto://127.0.0.1:{mailbox.port}?from=unattended@localhost"
        "&to=ops@example.org&mode=insecure"
    )


def delivered(post: dict[str, Any]) -> str:
    """Return what a ``json://`` post says: Apprise's title and message."""
    return f"{post['title']}\n{post['message']}".strip()


class TestEachKindThroughApprise:
    @pytest.mark.parametrize("kind", list(EVENTS))
    def test_reaches_a_json_url_and_a_mailto_url(
        self, kind: str, webhook: Any, mailbox: Any, tmp_path: Path
    ) -> None:
        event, data, expected = EVENTS[kind]
        config = NotifyConfig(urls=[json_url(webhook), mailto_url(mailbox)], timeout_seconds=5)
        Notifier(config, "c", tmp_path / "n.jsonl").on_event(event, data)

        assert len(webhook.posts) == 1
        assert expected in delivered(webhook.posts[0])
        assert len(mailbox.messages) == 1
        message = mailbox.messages[0]
        assert message["To"] == "ops@example.org"
        assert expected in f"{message['Subject']}\n{message.get_payload()}"
        entries = _journal(tmp_path / "n.jsonl")
        assert [(e["channel"], e["kind"], e["status"]) for e in entries] == [
            ("json://127.0.0.1", kind, "sent"),
            ("mailto://127.0.0.1", kind, "sent"),
        ]

    def test_a_multi_line_notice_has_its_first_line_as_the_title(
        self, webhook: Any, tmp_path: Path
    ) -> None:
        link = ("http://127.0.0.1:4200/v2/runs/flow-run/r1", "r1")
        config = NotifyConfig(urls=[json_url(webhook)])
        Notifier(config, "c", tmp_path / "n.jsonl", lambda: link).on_event(*EVENTS["suspend"][:2])
        post = webhook.posts[0]
        assert post["title"] == f"[unattended] {EVENTS['suspend'][2]}"
        assert "CLI: unattended approve r1 --as NAME [--reject]" in post["message"]


class TestOnceOnly:
    def test_a_replayed_event_is_not_sent_again_on_any_channel(
        self, webhook: Any, mailbox: Any, tmp_path: Path
    ) -> None:
        config = NotifyConfig(urls=[json_url(webhook), mailto_url(mailbox)])
        for _ in range(2):  # a new notifier each time: the flow ran again from the top
            Notifier(config, "c", tmp_path / "n.jsonl").on_event(*EVENTS["suspend"][:2])
        assert (len(webhook.posts), len(mailbox.messages)) == (1, 1)
        assert [e["status"] for e in _journal(tmp_path / "n.jsonl")] == ["sent", "sent"]

    def test_a_channel_that_failed_is_tried_again_the_others_are_not(
        self, webhook: Any, tmp_path: Path
    ) -> None:
        down = "json://127.0.0.1:9/hooks/down"  # port 9 (discard): nothing listens
        config = NotifyConfig(urls=[json_url(webhook), down], timeout_seconds=5)
        notifier = Notifier(config, "c", tmp_path / "n.jsonl")
        for _ in range(2):
            notifier.on_event(*EVENTS["failed"][:2])
        assert len(webhook.posts) == 1
        assert [(e["channel"], e["status"], e["error"]) for e in _journal(notifier.journal)] == [
            ("json://127.0.0.1", "sent", None),
            ("json://127.0.0.1#2", "failed", "not_delivered"),
            ("json://127.0.0.1#2", "failed", "not_delivered"),
        ]


class TestSecrets:
    def test_no_secret_of_a_url_reaches_the_journal_or_the_logs(
        self, webhook: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.DEBUG)  # Apprise's and urllib3's debug lines show URLs
        down = f"json://{SECRET_USER}:{SECRET_PASSWORD}@127.0.0.1:9/hooks/{SECRET_TOKEN}"
        unusable = f"slack://{SECRET_TOKEN}/"  # Apprise logs the URL it cannot parse
        urls = [json_url(webhook, secret=True), down, unusable]
        config = NotifyConfig(urls=urls, timeout_seconds=5)
        Notifier(config, "c", tmp_path / "n.jsonl").on_event(*EVENTS["failed"][:2])

        assert "campaign c failed" in delivered(webhook.posts[0])
        text = (tmp_path / "n.jsonl").read_text()
        logged = caplog.text + "".join(str(r.args) for r in caplog.records)
        assert "JSON POST URL" in caplog.text  # the lines that would show the path were seen
        for secret in (SECRET_USER, SECRET_PASSWORD, SECRET_TOKEN):
            assert secret not in text
            assert secret not in logged
        assert [
            (e["channel"], e["status"], e["error"]) for e in _journal(tmp_path / "n.jsonl")
        ] == [
            ("json://127.0.0.1", "sent", None),
            ("json://127.0.0.1#2", "failed", "not_delivered"),
            ("slack", "failed", "invalid_url"),
        ]

    @pytest.mark.parametrize(
        ("url", "name"),
        [
            ("ntfys://ntfy.example.org/topic", "ntfys://ntfy.example.org"),
            ("ntfy://secret-topic", "ntfy"),
            ("tgram://123456789:AAbbCC/42", "tgram"),
            ("slack://T0KEN-Abc/B1/C2", "slack"),
            ("mailtos://user:pw@mail.example.org?to=a@example.org", "mailtos://mail.example.org"),
            ("json://[::1]:8080/x", "json://::1"),
        ],
    )
    def test_a_channel_is_named_by_scheme_and_a_real_host_only(self, url: str, name: str) -> None:
        assert channel_name(url) == name

    def test_a_token_in_the_host_and_port_place_is_masked_in_logs(self) -> None:
        secrets = secret_parts("tgram://123456789:AAbbCCdd/4242")
        assert {"123456789", "AAbbCCdd", "4242"} <= set(secrets)

    def test_the_provenance_records_the_spec_without_the_urls(
        self, webhook: Any, tmp_path: Path
    ) -> None:
        notify = (
            f'\n[notify]\nurls = ["{json_url(webhook, secret=True)}"]\n'
            f'webhook_url = "http://127.0.0.1:9/hooks/{SECRET_TOKEN}"\nevents = ["failed"]\n'
        )
        spec = _campaign(tmp_path, "ns", "", notify)
        home = tmp_path / "home"
        asyncio.run(run_direct(spec, state_dir=home, env={}))
        with ProvenanceStore.open(home / "campaigns" / "ns") as store:
            recorded = json.dumps(store.summary("ns")["campaign"]["spec"])
        assert '"<secret json://127.0.0.1>"' in recorded
        assert '"<secret http://127.0.0.1>"' in recorded
        for secret in (SECRET_USER, SECRET_PASSWORD, SECRET_TOKEN):
            assert secret not in recorded


class TestOlderSettings:
    def test_the_webhook_and_smtp_settings_are_apprise_urls(self) -> None:
        config = NotifyConfig(
            webhook_url="https://hooks.example.org/services/T1/B2/C3?x=1",
            email_to=["a@example.org", "b@example.org"],
            smtp_host="relay.example.org",
            smtp_port=2525,
        )
        webhook, email = channels(config)
        assert webhook.name == "webhook"
        assert webhook.url.startswith("jsons://hooks.example.org/services/T1/B2/C3?-x=1")
        assert email.name == "email"
        assert email.url.startswith("mailto://relay.example.org:2525?")
        assert "to=a%40example.org%2Cb%40example.org" in email.url


class TestCheck:
    def test_a_url_apprise_cannot_use_is_refused_by_index_with_exit_2(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        notify = (
            '\n[notify]\nurls = ["ntfys://ntfy.example.org/topic", '
            f'"slack://{SECRET_TOKEN}/", "nonsense://{SECRET_USER}:{SECRET_PASSWORD}@x.org/"]\n'
        )
        spec = _campaign(tmp_path, "nc", "", notify)
        assert main(["check", str(spec)]) == 2
        captured = capsys.readouterr()
        err = captured.err
        assert f"{spec}: field 'notify.urls[1]': Apprise cannot use this 'slack' URL" in err
        assert f"{spec}: field 'notify.urls[2]'" in err
        assert "notify.urls[0]" not in err
        for secret in (SECRET_USER, SECRET_PASSWORD, SECRET_TOKEN):
            assert secret not in captured.out + err

    def test_a_bad_url_in_the_site_config_is_refused_naming_the_site_file(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        spec = _campaign(tmp_path, "nsite", "", "")
        site = tmp_path / "site.toml"
        site.write_text(
            (ROOT / "site-configs" / "local.toml").read_text()
            + f'\n[notify]\nurls = ["slack://{SECRET_TOKEN}/"]\n'
        )
        assert main(["check", str(spec), "--site", str(site)]) == 2
        err = capsys.readouterr().err
        assert f"{site}: field 'notify.urls[0]'" in err
        assert SECRET_TOKEN not in err


CRASHED_RUN = """
import asyncio, sys
from flows._engine._direct import run_direct
env = {"UNATTENDED_FAILPOINTS": sys.argv[3]}
asyncio.run(run_direct(sys.argv[1], state_dir=sys.argv[2], env=env))
"""


class TestFromTheEngineThroughApprise:
    def test_a_crash_before_round_0_completed_is_followed_by_a_recovered_notice(
        self, webhook: Any, mailbox: Any, tmp_path: Path
    ) -> None:
        urls = f'["{json_url(webhook)}", "{mailto_url(mailbox)}"]'
        spec = _campaign(tmp_path, "early", BLOCK_ROUND_1, f"\n[notify]\nurls = {urls}\n")
        home = tmp_path / "home"
        # A real crash: the run is SIGKILLed once it marked the campaign running, before
        # round 0 did anything (its lease is left held, its status says running).
        crashed = subprocess.run(
            [sys.executable, "-c", CRASHED_RUN, str(spec), str(home), "campaign_start:1"],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            timeout=120,
        )
        assert crashed.returncode == -9, crashed.stderr.decode()[-2000:]
        assert webhook.posts == []

        result = asyncio.run(run_direct(spec, state_dir=home, env={}))
        assert (result.status, result.error_code) == ("blocked", "policy_denied")
        assert [delivered(p) for p in webhook.posts] == [
            "[unattended] campaign early recovered: it continues from round 0 after a restart; "
            "nothing done before is repeated",
            "[unattended] campaign early was blocked in round 1 (policy_denied)",
        ]
        assert [m["Subject"] for m in mailbox.messages] == [
            "[unattended] campaign early recovered: it continues from round 0 after a restart; "
            "nothing done before is repeated",
            "[unattended] campaign early was blocked in round 1 (policy_denied)",
        ]
        entries = _journal(home / "campaigns" / "early" / "notifications.jsonl")
        assert [(e["kind"], e["channel"]) for e in entries] == [
            ("recovered", "json://127.0.0.1"),
            ("recovered", "mailto://127.0.0.1"),
            ("blocked", "json://127.0.0.1"),
            ("blocked", "mailto://127.0.0.1"),
        ]

    def test_a_fresh_campaign_sends_no_recovered_notice(self, webhook: Any, tmp_path: Path) -> None:
        notify = f'\n[notify]\nurls = ["{json_url(webhook)}"]\n'
        spec = _campaign(tmp_path, "fresh", BLOCK_ROUND_1, notify)
        asyncio.run(run_direct(spec, state_dir=tmp_path / "home", env={}))
        assert [delivered(p) for p in webhook.posts] == [
            "[unattended] campaign fresh was blocked in round 1 (policy_denied)"
        ]
