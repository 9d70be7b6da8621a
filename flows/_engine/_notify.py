"""Tell people when a campaign waits, stops, fails or recovers: Apprise URLs, a webhook, email.

Why here and not Prefect's notification blocks or automations: the events are the
engine's (a policy blocked round 3, an approval waits for alice with this deadline),
they must reach people for campaigns run without Prefect too, and a delivery must
never touch the campaign. So the engine's event hook calls this module, and a
delivery that fails is logged and recorded, never raised. A run's hook queues its
notices (:class:`NoticeSender`): one thread delivers them in order, so a channel
that is slow or down never holds up a round.

Every channel goes through Apprise (the library Prefect's own notification blocks
use), which speaks Slack, Teams, Matrix, ntfy, email and about a hundred more by
URL: each of ``[notify] urls`` is a channel, and the older settings are expressed
as Apprise URLs too. ``webhook_url`` becomes a ``json://`` URL whose payload is
remapped to exactly ``{"text": ...}`` (what Slack and Mattermost incoming webhooks
read, and what this setting always posted); the SMTP settings become one
``mailto://`` URL (plain SMTP, as before: no STARTTLS unless a ``mailtos://`` URL
asks for it).

Every delivery attempt is a line of ``notifications.jsonl`` in the campaign's
directory (kind, channel, ``sent`` or ``failed`` with a reason). The same
notice is sent once per channel: a flow that runs again from the top after a resume
replays its suspend event, and the journal's ``sent`` lines stop a second message.
Messages carry names, rounds, codes and links, never proposal content or secrets.

An Apprise URL holds its service's token or password, so a URL is a secret: a
channel is named by its scheme and host only (``ntfys://ntfy.example.org``; the
scheme alone where the host part is a token, as in ``slack://T1/B2/C3``), and while
Apprise works, its log records (and urllib3's) have every secret part of the URL
masked, as they would otherwise show the path or the whole URL.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from flows._masking import channel_name
from flows._paths import append_private
from tasks import NotifyConfig

log = logging.getLogger("unattended.notify")

# Engine event -> notice kind (``stopped`` splits by the run's status).
_KINDS = {"suspend": "suspend", "failed": "failed", "recovered": "recovered"}

# The loggers that can print a URL while Apprise delivers: Apprise's own (its debug
# lines show the URL it posts to, its errors an URL it cannot parse) and urllib3's
# (each request's path).
_CHATTY_LOGGERS = ("apprise", "urllib3.connectionpool")
_MASK = "***"


class Notice(NamedTuple):
    """One notice to deliver: its once-only key, its kind, its text."""

    key: str
    kind: str
    text: str


class Channel(NamedTuple):
    """One place a notice goes: a name safe to show, and the Apprise URL (a secret)."""

    name: str
    url: str
    whole_text: bool  # the text goes in the body as it is (no title): the webhook's payload


def secret_parts(url: str) -> list[str]:
    """Return the pieces of ``url`` that may be secret, longest first (to mask in logs).

    Everything but the scheme and a real host: user, password, path segments, query
    values, fragment, and the host itself when it is a token.
    """
    pieces = {url}
    try:
        parts = urlsplit(url)
        userinfo, _, host = parts.netloc.rpartition("@")
        pieces.update([userinfo, parts.username or "", parts.password or "", parts.fragment])
        pieces.update(parts.path.split("/"))
        pieces.update(value for _, value in parse_qsl(parts.query, keep_blank_values=True))
        if "://" not in channel_name(url):
            # A token where the host would be (as written: urlsplit lowercases hostname),
            # with what looks like a port (Telegram's ``ID:TOKEN``).
            pieces.update([host, *host.split(":")])
    except ValueError:
        # Not even a URL to split: mask whatever follows the scheme.
        pieces.add(url.partition("://")[2])
    pieces |= {unquote(piece) for piece in pieces} | {quote(piece, safe="") for piece in pieces}
    # A piece of three characters or fewer is no secret, and masking it would mangle logs.
    return sorted((piece for piece in pieces if len(piece) > 3), key=len, reverse=True)


class _Masking(logging.Filter):
    """Mask the secret parts of the URLs being delivered in every record of a logger."""

    def __init__(self, secrets: Sequence[str]) -> None:
        super().__init__()
        self.secrets = secrets

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        masked = text
        for secret in self.secrets:
            masked = masked.replace(secret, _MASK)
        if masked != text:
            record.msg, record.args = masked, None
        return True


@contextmanager
def masked_logs(urls: Sequence[str]) -> Iterator[None]:
    """Mask the secret parts of ``urls`` in Apprise's and urllib3's log records meanwhile."""
    secrets = sorted({s for url in urls for s in secret_parts(url)}, key=len, reverse=True)
    mask = _Masking(secrets)
    loggers = [logging.getLogger(name) for name in _CHATTY_LOGGERS]
    for logger in loggers:
        logger.addFilter(mask)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(mask)


def webhook_as_apprise(url: str) -> str:
    """Return the Apprise ``json(s)://`` URL that posts exactly ``{"text": <body>}`` to ``url``.

    Apprise's JSON payload is ``version, title, message, attachments, type``; the
    ``:field=`` parameters rename ``message`` to ``text`` and drop the rest. The
    webhook's own query parameters become Apprise's ``-name=value`` ones (passed on).
    """
    parts = urlsplit(url)
    scheme = "jsons" if parts.scheme.lower() == "https" else "json"
    query = [(f"-{name}", value) for name, value in parse_qsl(parts.query, keep_blank_values=True)]
    query += [(":message", "text")] + [(f":{drop}", "") for drop in _JSON_FIELDS_DROPPED]
    return f"{scheme}://{parts.netloc}{parts.path or '/'}?{urlencode(query)}"


_JSON_FIELDS_DROPPED = ("version", "title", "attachments", "type")


def email_as_apprise(config: NotifyConfig) -> str:
    """Return the Apprise ``mailto://`` URL for the SMTP settings (plain SMTP, as before)."""
    query = urlencode(
        {
            "from": config.email_from,
            "to": ",".join(config.email_to),
            "mode": "insecure",
            "format": "text",
        }
    )
    host = f"[{config.smtp_host}]" if ":" in config.smtp_host else config.smtp_host
    return f"mailto://{host}:{config.smtp_port}?{query}"


def channels(config: NotifyConfig) -> list[Channel]:
    """Return every channel of ``config``: the webhook, the mailboxes, then each URL.

    The webhook and email keep the channel names they always had (``webhook``,
    ``email``), so journals written before still stop a second message. Two URLs
    with the same scheme and host are told apart by ``#2``, ``#3`` in order.
    """
    found: list[Channel] = []
    if config.webhook_url is not None:
        found.append(
            Channel("webhook", webhook_as_apprise(config.webhook_url.get_secret_value()), True)
        )
    if config.email_to:
        found.append(Channel("email", email_as_apprise(config), False))
    seen: dict[str, int] = {}
    for secret in config.urls:
        url = secret.get_secret_value()
        name = channel_name(url)
        seen[name] = seen.get(name, 0) + 1
        found.append(Channel(name if seen[name] == 1 else f"{name}#{seen[name]}", url, False))
    return found


def _apprise() -> ModuleType:
    """Import Apprise (lazily: it loads ~160 plugins, 0.4 s, only when a notice goes out).

    Apprise 2.0's e-mail plugin imports the stdlib ``imghdr``, deprecated since Python
    3.11; that warning is Apprise's, not a problem of ours, and must not fail a run
    with warnings as errors (as the tests run).
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*imghdr", category=DeprecationWarning)
        import apprise
        import apprise.plugins.email  # the module that imports imghdr

    return apprise


def url_problem(url: str) -> str | None:
    """Return why Apprise cannot use ``url`` (without its secret parts), or None."""
    apprise = _apprise()

    with masked_logs([url]):
        plugin = apprise.Apprise.instantiate(url, suppress_exceptions=True)
    if plugin is not None:
        return None
    return (
        f"Apprise cannot use this {channel_name(url)!r} URL (unknown scheme, or a token or "
        "address it needs is missing or malformed); see the service's page at "
        "https://github.com/caronc/apprise/wiki"
    )


class Notifier:
    """Deliver a campaign's notices on each of its channels; record every attempt.

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
        """Deliver the notice an engine event makes, if any, now (:class:`NoticeSender` queues)."""
        notice = self.notice(kind, data)
        if notice is not None:
            self.send(*notice)

    def notice(self, kind: str, data: Mapping[str, Any]) -> Notice | None:
        """Return the notice an engine event makes, or None when it is not a configured kind."""
        notice = kind
        if kind == "stopped":
            notice = str(data.get("status"))
        elif kind not in _KINDS:
            return None
        if notice not in self.config.events:
            return None
        return Notice(self._key(notice, data), notice, self._text(notice, data))

    def send(self, key: str, kind: str, text: str) -> None:
        """Deliver ``text`` on every channel not yet sent for ``key``; never raise."""
        done = self._sent_channels(key)
        for channel in channels(self.config):
            if channel.name in done:
                continue
            try:
                error = self._deliver(channel, text)
            except Exception as exc:  # noqa: BLE001  # a notice must never fail the campaign
                error = type(exc).__name__
            if error is None:
                self._record(key, kind, channel.name, "sent", None)
            else:
                log.warning("notification %s via %s failed: %s", kind, channel.name, error)
                self._record(key, kind, channel.name, "failed", error)

    def _deliver(self, channel: Channel, text: str) -> str | None:
        """Send ``text`` through Apprise on ``channel``; return why it failed, or None."""
        apprise = _apprise()

        first, _, rest = text.partition("\n")
        if channel.whole_text:
            title, body = "", text
        elif channel.url.lower().startswith(("mailto:", "mailtos:")):
            title, body = first, text  # the subject, then the whole notice as before
        else:
            # Chat services show a title above the body: the first line once, not twice.
            title, body = (first, rest) if rest else ("", first)
        with masked_logs([channel.url]):
            plugin = apprise.Apprise.instantiate(channel.url, suppress_exceptions=True)
            if plugin is None:
                return "invalid_url"
            # Apprise's connect and read timeouts (its ``cto``/``rto`` URL parameters).
            plugin.socket_connect_timeout = self.config.timeout_seconds
            plugin.socket_read_timeout = self.config.timeout_seconds
            bundle = apprise.Apprise()
            bundle.add(plugin)
            sent = bundle.notify(title=title, body=body, body_format=apprise.NotifyFormat.TEXT)
        # Apprise says only whether it worked; why not is in its (masked) warning log.
        return None if sent else "not_delivered"

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


class NoticeSender:
    """Deliver a :class:`Notifier`'s notices from a queue, in order, in one thread of its own.

    The engine's event hook only queues (:meth:`on_event`): a channel that is slow
    or down never holds up a round (Apprise delivers synchronously, up to
    ``timeout_seconds`` a channel). :meth:`aclose` waits, with a bound, for what is
    queued when the run ends or suspends, so a notice emitted just before the end is
    still delivered and journaled once. A notice still queued when the process is
    killed is not journaled as sent: the next run's event sends it then.
    """

    def __init__(self, notifier: Notifier) -> None:
        self.notifier = notifier
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="notices")
        self._queued: list[Future[None]] = []

    def on_event(self, kind: str, data: Mapping[str, Any]) -> None:
        """Queue the notice an engine event makes, if any (see :meth:`Notifier.notice`)."""
        notice = self.notifier.notice(kind, data)
        if notice is not None:
            self._queued = [f for f in self._queued if not f.done()]
            self._queued.append(self._pool.submit(self.notifier.send, *notice))

    def bound(self) -> float:
        """Return how long the queued notices may take: each delivery's timeout, summed."""
        pending = sum(1 for future in self._queued if not future.done())
        deliveries = pending * max(1, len(channels(self.notifier.config)))
        return deliveries * self.notifier.config.timeout_seconds + 1.0

    async def aclose(self, seconds: float | None = None) -> bool:
        """Wait up to ``seconds`` (default :meth:`bound`) for the queued notices; True if all went.

        The thread takes nothing new after this; one still delivering when the bound
        passes is left to finish on its own (its journal line is written then).
        """
        limit = self.bound() if seconds is None else seconds
        self._pool.shutdown(wait=False)
        pending = [future for future in self._queued if not future.done()]
        if not pending:
            return True
        _, late = await asyncio.to_thread(wait_futures, pending, limit)
        if late:
            log.warning("%d notification(s) not delivered within %.0f s", len(late), limit)
        return not late


def chain(
    *hooks: Callable[[str, Mapping[str, Any]], None],
) -> Callable[[str, Mapping[str, Any]], None]:
    """Return one event hook that calls each of ``hooks`` in turn."""

    def on_event(kind: str, data: Mapping[str, Any]) -> None:
        for hook in hooks:
            hook(kind, data)

    return on_event
