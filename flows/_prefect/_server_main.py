"""The server process: Prefect's API and UI, with its busy-database answers retried in place.

``unattended server start`` runs ``python -m flows._prefect._server_main`` where it once
ran ``prefect server start``: the same app (``create_app(final=True)``, services in the
process), served by uvicorn with the settings that command reads, behind ``RetryBusy``.

Why: on SQLite, Prefect opens most write transactions DEFERRED. One that has read and
then writes while another connection committed gets "database is locked" at once (no
busy timeout helps a stale snapshot), and the API answers 503 with no ``Retry-After``.
Prefect's client then waits ``2 ** try`` seconds: 2 s on the first retry. Measured with
``benchmarks/many_campaigns.py`` (50 campaigns, SQLite): 25 such answers while the
campaigns were submitted, nearly one a submission (``create_deployment``,
``create_flow_run_from_deployment``), and submit -> round 0 of a 51st campaign either
~1.2 s or ~3.3 s. ``RetryBusy`` runs the same request again in the server after a few
tens of milliseconds, which is what the client would do two seconds later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

from tenacity import AsyncRetrying, RetryCallState, retry_if_result, stop_before_delay

from flows._prefect._asgi import App, Message, Receive, Scope, Send, read_body, replay_body

# How long one request may be run again in the server before its 503 goes to the client
# (whose own retries then start: 2 s, 4 s, ...; the setting
# UNATTENDED_SERVER_BUSY_RETRY_SECONDS), the first pause and the longest one.
BUSY_RETRY_SECONDS: Final = 3.0
BUSY_FIRST_DELAY: Final = 0.02
BUSY_MAX_DELAY: Final = 0.5
# A person's answer (the UI's Resume, ``unattended approve``) is run again for longer
# (UNATTENDED_SERVER_ANSWER_RETRY_SECONDS), and goes first: while it is run again, other
# requests wait to start, and it waits (up to HUMAN_DRAIN_SECONDS) for those already
# running to finish. With 4 campaigns running on SQLite, 2 of 40 Resumes still got 503
# after 3 s of plain retries (docs/benchmarks.md).
HUMAN_BUSY_RETRY_SECONDS: Final = 30.0
HUMAN_DRAIN_SECONDS: Final = 2.0
# The requests that carry a person's answer: a run's resume and its input.
_HUMAN = re.compile(r"^/api/flow_runs/[^/]+/(resume|input)$")
_READS = frozenset({"GET", "HEAD", "OPTIONS"})
_UNAVAILABLE: Final = 503
# In the server's log with Prefect's own lines (its logging is set up for "prefect.*").
_log = logging.getLogger("prefect.server.unattended")
# On an answer whose request was run again in the server: how many times.
RETRIED_HEADER: Final = b"x-unattended-busy-retries"


class RetryBusy:
    """ASGI middleware: run an HTTP request again while the app answers it 503.

    Prefect's API answers 503 only for errors its clients retry (a locked SQLite
    database, a dropped PostgreSQL connection): the request's transaction was rolled
    back and the client sends the same request again. Here it is sent again in the
    server, after ``first_delay`` doubling to ``max_delay`` (each with jitter, so the
    waiting requests do not wake together), for up to ``budget`` seconds; then the
    503 goes to the client as before. A request is therefore run again exactly when
    Prefect's own client would run it again, only sooner.

    The request body is read whole first (API bodies are small JSON) so each run can
    be given it. A response that is not 503 is passed on as it is produced (a stream
    stays a stream); a 503 is held back until it is known whether the request runs
    again, and the last one goes to the client. Starlette re-raises an error after its
    handler sent the 503: that error is dropped with the answer it came with, and
    raised with the last one.
    WebSocket and lifespan traffic pass through untouched. An answer that took runs
    again says how many in its ``x-unattended-busy-retries`` header.

    A person's answer (``POST /api/flow_runs/{id}/resume`` or ``.../input``) is run
    again for ``human_budget`` seconds (30 s by default, or ``budget`` if longer;
    with either 0 it is a request like any other) and takes the floor once it met a
    503: until it is answered, writes that arrive wait to start, and before each run
    again it waits (up to ``drain`` seconds) for the writes already running (a read,
    GET or HEAD, takes no write lock and is never held back). So its transaction
    meets no other writer of ours; only the server's own services still write.
    """

    def __init__(
        self,
        app: App,
        *,
        budget: float = BUSY_RETRY_SECONDS,
        first_delay: float = BUSY_FIRST_DELAY,
        max_delay: float = BUSY_MAX_DELAY,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        human_budget: float = HUMAN_BUSY_RETRY_SECONDS,
        drain: float = HUMAN_DRAIN_SECONDS,
    ) -> None:
        self.app = app
        self.budget = budget
        # 0 (or no retries at all): a person's answer is a request like any other.
        self.human_budget = max(budget, human_budget) if budget > 0 and human_budget > 0 else 0.0
        self.drain = drain
        self.first_delay = first_delay
        self.max_delay = max_delay
        self._sleep = sleep
        self.retried = 0  # requests run again (all of them, since start): for tests and logs
        self._running = 0  # requests other than a person's, running in the app now
        self._idle = asyncio.Event()  # set while none is
        self._idle.set()
        self._floor_free = asyncio.Event()  # cleared while a person's answer is run again
        self._floor_free.set()
        self._holding = 0  # people's answers holding the floor

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = await read_body(receive)
        if body is None:
            return  # the client left before it finished sending: nobody to answer
        path = scope.get("path", "")
        if self.human_budget and scope.get("method") == "POST" and _HUMAN.match(path):
            await self._serve_first(scope, body, receive, send)
            return
        if scope.get("method") in _READS:  # takes no write lock: never held back
            await self._serve(scope, body, receive, send, self.budget, None)
            return
        if not self._floor_free.is_set():
            with contextlib.suppress(TimeoutError):  # never longer than a person's budget
                await asyncio.wait_for(self._floor_free.wait(), self.human_budget)
        self._running += 1
        self._idle.clear()
        try:
            await self._serve(scope, body, receive, send, self.budget, None)
        finally:
            self._running -= 1
            if not self._running:
                self._idle.set()

    async def _serve_first(self, scope: Scope, body: bytes, receive: Receive, send: Send) -> None:
        """Serve a person's answer; after its first 503 it holds the floor until answered."""
        held = False

        async def take_floor() -> None:
            nonlocal held
            if not held:
                held = True
                self._holding += 1
                self._floor_free.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), self.drain)

        try:
            await self._serve(scope, body, receive, send, self.human_budget, take_floor)
        finally:
            if held:
                self._holding -= 1
                if not self._holding:
                    self._floor_free.set()

    async def _serve(
        self,
        scope: Scope,
        body: bytes,
        receive: Receive,
        send: Send,
        budget: float,
        before_again: Callable[[], Awaitable[None]] | None,
    ) -> None:
        again = 0

        async def run_once() -> _Run:
            run = _Run(send, again=again)
            try:
                # A copy: Starlette's mounts rewrite the scope's path in place.
                await self.app(dict(scope), replay_body(body, receive), run.send)
            except Exception as exc:
                if not run.held:
                    raise
                run.error = exc  # raised only if this 503 is the one the client gets
            return run

        async def run_again(state: RetryCallState) -> None:
            nonlocal again
            again += 1
            self.retried += 1
            if before_again is not None:
                await before_again()

        deadline = time.monotonic() + budget
        last = await run_once()
        if not last.held:
            return
        first = [last]

        async def first_then_again() -> _Run:
            # tenacity is given the run made above as its first: a call through it costs
            # ~0.1 ms, which every request would pay.
            return first.pop() if first else await run_once()

        # Budget: `budget` seconds (no pause begun past them), first_delay doubling to
        # max_delay between runs, jittered; then the last 503 goes to the client.
        last = await AsyncRetrying(
            retry=retry_if_result(lambda run: run.held),
            stop=stop_before_delay(max(deadline - time.monotonic(), 0.0)),
            wait=self._pause,
            sleep=self._sleep,
            before_sleep=run_again,
            retry_error_callback=_last_run,
        )(first_then_again)
        if not last.held:
            return
        if again:
            _log.warning(
                "%s %s: answered 503 again after %d runs; passed to the client",
                scope.get("method"),
                scope.get("path"),
                again + 1,
            )
        await last.pass_on()
        if last.error is not None:
            raise last.error

    def _pause(self, state: RetryCallState) -> float:
        delay = min(self.first_delay * 2.0 ** (state.attempt_number - 1), self.max_delay)
        return delay * (0.5 + random.random())  # noqa: S311  # jitter, not a secret


def _last_run(state: RetryCallState) -> Any:
    """Return the last run once the budget is spent."""
    return state.outcome.result()  # type: ignore[union-attr]  # set after every run


class _Run:
    """One run of the app for a request: holds back a 503 answer until told to pass it on."""

    def __init__(self, send: Send, *, again: int) -> None:
        self._send = send
        self._again = again
        self._kept: list[Message] = []
        self.held = False
        self.error: Exception | None = None

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.held = message.get("status") == _UNAVAILABLE
        if self.held:
            self._kept.append(message)
        else:
            await self._send(self._marked(message))

    async def pass_on(self) -> None:
        """Send the 503 held back, as the app produced it."""
        for message in self._kept:
            await self._send(self._marked(message))

    def _marked(self, message: Message) -> Message:
        if message["type"] == "http.response.start" and self._again:
            # Says to the client (and to tests) that its request was run again here.
            headers = [*message.get("headers", ()), (RETRIED_HEADER, b"%d" % self._again)]
            return {**message, "headers": headers}
        return message


def _make_private(root: str) -> None:
    """Make every folder under ``root`` 0700 and every file 0600 (symlinks left alone)."""
    for folder, _, files in os.walk(root):
        os.chmod(folder, 0o700)
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chmod(path, 0o600)


def main() -> None:
    """Serve Prefect's app as ``prefect server start`` would, behind ``RetryBusy``."""
    import prefect
    import uvicorn
    from prefect.server.api.server import create_app
    from prefect.settings import (
        PREFECT_SERVER_API_HOST,
        PREFECT_SERVER_API_KEEPALIVE_TIMEOUT,
        PREFECT_SERVER_API_PORT,
        PREFECT_SERVER_API_WEBSOCKET_PING_INTERVAL,
        PREFECT_SERVER_API_WEBSOCKET_PING_TIMEOUT,
        PREFECT_SERVER_LOGGING_LEVEL,
    )

    from flows._prefect._identity import with_identity
    from flows._prefect._tls import SERVER_CERT_VARIABLE, SERVER_KEY_VARIABLE
    from flows._settings import Settings

    # Checked by `unattended server start` before it starts this process.
    settings = Settings.from_env(os.environ)
    budget = settings.server_busy_retry_seconds
    host, port = PREFECT_SERVER_API_HOST.value(), PREFECT_SERVER_API_PORT.value()
    app = create_app(final=True, webserver_only=False)
    # create_app copies Prefect's UI bundle into the state directory with the modes of
    # the installation (0755 folders): nothing secret, but a state directory is private
    # all through, so the copy is made private like the rest.
    static = os.environ.get("PREFECT_SERVER_UI_STATIC_DIRECTORY")
    if static:
        _make_private(static)
    # The server's log says what serves it (at WARNING: the level the server logs at).
    _log.warning(
        "Prefect %s server on %s:%s, a busy database's 503 run again in the server for up to %g s",
        prefect.__version__,
        host,
        port,
        budget,
    )
    uvicorn.run(
        with_identity(  # who calls: flows._prefect._identity
            RetryBusy(app, budget=budget, human_budget=settings.server_answer_retry_seconds)
        ),
        host=host,
        port=port,
        timeout_keep_alive=PREFECT_SERVER_API_KEEPALIVE_TIMEOUT.value(),
        ws_ping_interval=PREFECT_SERVER_API_WEBSOCKET_PING_INTERVAL.value(),
        ws_ping_timeout=PREFECT_SERVER_API_WEBSOCKET_PING_TIMEOUT.value(),
        log_level=PREFECT_SERVER_LOGGING_LEVEL.value().lower(),
        # HTTPS with the state directory's key (flows._prefect._tls; set by server_env).
        ssl_keyfile=os.environ.get(SERVER_KEY_VARIABLE) or None,
        ssl_certfile=os.environ.get(SERVER_CERT_VARIABLE) or None,
    )


if __name__ == "__main__":
    main()
