"""Who calls the server: the owner, or an approver with a login of their own, and what each may do.

ASGI middleware around Prefect's app in the server process (``_server_main``). Each
HTTP request below ``/api`` is authenticated from its ``Authorization: Basic``
header, and each websocket from its first (``auth``) message, as Prefect does:

* the **owner's** credential (``<state_dir>/prefect/api-auth``, what the runner, the
  flow runs and the owner's CLI send) may do anything, as before;
* an **approver's** ``NAME:SECRET`` (``unattended approvers add``; checked against the
  salted scrypt hash in ``approver-logins.json``, re-read when the file changes) may
  only read (``_identity_rules``) and resume the current waiting run of a campaign
  whose rule names them (``_identity_resume``); anything else is 403 naming the rule;
* anything else is 401, and a client address with more than a few failed logins a
  second gets 429 without its login being tried.

Prefect's own basic-auth check stays on behind this one: an approver's request is
passed on with the owner's credential in place of theirs. So the UI still asks for a
login (``/ui-settings`` says ``BASIC``), and if this layer were ever left out, Prefect
would refuse every approver's login rather than let it through (fail closed).

Every resume that passes carries ``authenticated_as`` (``approver:NAME`` or
``owner``), written here only. No secret is ever logged.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import json
import logging
import os
import secrets
import time
from collections import deque
from pathlib import Path
from typing import Any, Final
from uuid import UUID

from flows._prefect._asgi import read_body, replay_body
from flows._prefect._identity_logins import ApproverLogins, Login, logins_path
from flows._prefect._identity_resume import (
    OWNER,
    STAMP,
    check_resume,
    stamp_admitted,
    stamped,
)
from flows._prefect._identity_rules import (
    APPROVER_SOCKETS,
    OPEN,
    RESUME,
    approver_access,
)

Scope = dict[str, Any]
_log = logging.getLogger("prefect.server.unattended")

# Failed logins a client address may make: FAILED_BURST at once, then FAILED_PER_SECOND.
FAILED_BURST: Final = 3
FAILED_PER_SECOND: Final = 2.0
_API = "/api"


# Checked in place of an unknown name's login: its hash matches no secret.
_NOBODY: Final = Login("", b"\0" * 16, b"", "")


class FailedLogins:
    """A token bucket of failed logins per client address (a few a second at most)."""

    def __init__(self, burst: int = FAILED_BURST, per_second: float = FAILED_PER_SECOND) -> None:
        self.burst = burst
        self.per_second = per_second
        self._failures: dict[str, deque[float]] = {}

    def blocked(self, client: str, now: float) -> bool:
        """Return whether ``client`` used up its failed logins for now."""
        window = self._failures.get(client)
        if not window:
            return False
        horizon = now - self.burst / self.per_second
        while window and window[0] < horizon:
            window.popleft()
        return len(window) >= self.burst

    def failed(self, client: str, now: float) -> None:
        """Count one failed login of ``client``."""
        self._failures.setdefault(client, deque()).append(now)
        if len(self._failures) > 10_000:  # many addresses: forget the oldest
            self._failures.pop(next(iter(self._failures)))


class Identity:
    """ASGI middleware: authenticate every request, and let approvers only read and resume."""

    def __init__(self, app: Any, *, owner: str, logins: Path) -> None:
        self.app = app
        self._owner = owner.encode("utf-8")
        self._owner_header = b"Basic " + base64.b64encode(self._owner)
        self._logins = ApproverLogins(logins)
        self._known: dict[str, Login] = {}
        self._mtime: tuple[int, int, int] | None = None
        # Right logins by a keyed hash of the header: scrypt once per login, not per request.
        self._key = secrets.token_bytes(32)
        self._verified: dict[bytes, str] = {}
        self.failed = FailedLogins()

    # -- who calls ------------------------------------------------------------------

    def _reload(self) -> None:
        """Read the logins again when the file changed (or appeared, or went)."""
        try:
            found = self._logins.path.stat()
            # Each write replaces the file (a new inode): two writes within one clock tick
            # of the file system still differ.
            mtime: tuple[int, int, int] | None = (found.st_ino, found.st_mtime_ns, found.st_size)
        except FileNotFoundError:
            mtime = None
        if mtime == self._mtime:
            return
        try:
            self._known = self._logins.read()
        except (OSError, ValueError, KeyError) as exc:
            # A file others may read, or a broken one: no approver logs in until it is fixed.
            _log.warning("approver logins unreadable (%s): none accepted", type(exc).__name__)
            self._known = {}
        self._mtime = mtime
        self._verified.clear()  # a revoked or replaced login stops working at once

    async def caller(self, credential: bytes, client: str) -> str | None:
        """Return ``"owner"``, ``"approver:NAME"``, ``"blocked"`` or None (not a login)."""
        if hmac.compare_digest(credential, self._owner):
            return OWNER
        self._reload()
        tag = hmac.new(self._key, credential, hashlib.sha256).digest()
        name = self._verified.get(tag)
        if name is not None:
            return f"approver:{name}"
        now = time.monotonic()
        if self.failed.blocked(client, now):
            return "blocked"
        user, colon, secret = credential.decode("utf-8", "replace").partition(":")
        login = (self._known.get(user) if colon else None) or _NOBODY
        # An unknown name costs the same scrypt as a known one: no telling names by time.
        if await asyncio.to_thread(login.matches, secret) and login is not _NOBODY:
            self._verified[tag] = user
            return f"approver:{user}"
        self.failed.failed(client, now)
        return None

    # -- the ASGI entry -------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] not in ("http", "websocket") or not (
            path == _API or path.startswith(_API + "/")
        ):
            await self.app(scope, receive, send)  # the UI's files, lifespan
            return
        below = path[len(_API) :] or "/"
        if scope["type"] == "websocket":
            await self.app(scope, self._socket_receive(scope, below, receive), send)
            return
        method = scope.get("method", "GET")
        if (method, below) in OPEN:
            await self.app(scope, receive, send)
            return
        credential = _basic(scope)
        if credential is None:
            await self.app(scope, receive, send)  # Prefect answers 401
            return
        who = await self.caller(credential, _client(scope))
        if who == "blocked":
            await _answer(send, 429, "too many failed logins from this address; wait a second")
            return
        if who is None:
            await _answer(send, 401, "Unauthorized")
            return
        if who == OWNER:
            resume = RESUME.fullmatch(below) if method == "POST" else None
            if resume is None:
                await self.app(scope, receive, send)
                return
            await self._resume(scope, receive, send, UUID(resume["id"]), None)
            return
        name = who.removeprefix("approver:")
        access = approver_access(method, below)
        if access == "refused":
            _log.warning("approver %s refused: %s %s (approver_allowlist)", name, method, path)
            await _answer(
                send,
                403,
                f"approver {name!r} may not {method} {path}: an approver's login reads runs and "
                "resumes the waiting run of a campaign whose rule names them (rule "
                "approver_allowlist); the rest is the owner's",
            )
            return
        scope = _as_owner(scope, self._owner_header)
        if access == "read":
            await self.app(scope, receive, send)
            return
        resume = RESUME.fullmatch(below)
        assert resume is not None  # approver_access said "resume"
        await self._resume(scope, receive, send, UUID(resume["id"]), name)

    async def _resume(
        self, scope: Scope, receive: Any, send: Any, flow_run_id: UUID, name: str | None
    ) -> None:
        """Pass a resume on with the server's stamp; an approver's only as the rules allow."""
        body = await read_body(receive)
        if body is None:
            return
        try:
            payload = json.loads(body) if body else {}
        except ValueError:
            payload = None
        run_input = payload.get("run_input") if isinstance(payload, dict) else None
        if name is not None:
            refused = await check_resume(flow_run_id, name, run_input)
            if refused is not None:
                _log.warning(
                    "approver %s refused: resume of %s (%s)", name, flow_run_id, refused.rule
                )
                await _answer(send, 403, f"{refused.message} (rule {refused.rule})")
                return
            if isinstance(run_input, dict) and "approver" not in run_input:
                run_input = {**run_input, "approver": name}
        if isinstance(payload, dict) and isinstance(run_input, dict):
            # Any stamp a client sent is dropped; the server's is added where the form has
            # room for it (not on a form stored by an older version: see stamp_admitted).
            identity = OWNER if name is None else f"approver:{name}"
            run_input = stamped(run_input, identity)
            if not await stamp_admitted(flow_run_id):
                run_input.pop(STAMP)
            body = json.dumps({**payload, "run_input": run_input}).encode()
        headers = [(k, v) for k, v in scope["headers"] if k != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await self.app({**scope, "headers": headers}, replay_body(body, receive), send)

    def _socket_receive(self, scope: Scope, below: str, receive: Any) -> Any:
        """Check a websocket's first ``auth`` message; an approver's only for the live streams."""
        checked = False

        async def receive_checked() -> Any:
            nonlocal checked
            message = await receive()
            if checked or message.get("type") != "websocket.receive":
                return message
            checked = True
            try:
                auth = json.loads(message.get("text") or message.get("bytes") or b"")
            except ValueError:
                return message  # Prefect closes a socket whose first message is not auth
            if not isinstance(auth, dict) or auth.get("type") != "auth":
                return message
            token = str(auth.get("token") or "").encode("utf-8")
            who = await self.caller(token, _client(scope)) if token else None
            if who == OWNER:
                return message
            if who is not None and who.startswith("approver:") and below in APPROVER_SOCKETS:
                auth["token"] = self._owner.decode("utf-8")
            else:
                auth["token"] = ""  # Prefect closes it: "Auth required but no token provided"
            return {"type": "websocket.receive", "text": json.dumps(auth)}

        return receive_checked


def _client(scope: Scope) -> str:
    """Return the address failed logins are counted against.

    uvicorn trusts ``X-Forwarded-For`` from 127.0.0.1 and puts the address it names
    in the scope: on a login node every local user connects from 127.0.0.1, so anyone
    could name a new address per guess. Requests that name one share one count.
    """
    forwarded = any(key in (b"x-forwarded-for", b"forwarded") for key, _ in scope["headers"])
    return "forwarded" if forwarded else str((scope.get("client") or ("?", 0))[0])


def _basic(scope: Scope) -> bytes | None:
    """Return the decoded ``user:secret`` of a Basic ``Authorization`` header, or None."""
    for key, value in scope.get("headers", ()):
        if key == b"authorization":
            scheme, _, encoded = value.partition(b" ")
            if scheme.lower() != b"basic":
                return b""
            try:
                return base64.b64decode(encoded.strip(), validate=True)
            except (binascii.Error, ValueError):
                return b""
    return None


def _as_owner(scope: Scope, header: bytes) -> Scope:
    """Return ``scope`` with the owner's credential in place of the approver's."""
    headers = [(k, v) for k, v in scope["headers"] if k != b"authorization"]
    return {**scope, "headers": [*headers, (b"authorization", header)]}


async def _answer(send: Any, status: int, message: str) -> None:
    body = json.dumps({"exception_message": message, "detail": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    if status == 429:
        headers.append((b"retry-after", b"1"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def with_identity(app: Any, env: dict[str, str] | None = None) -> Any:
    """Wrap ``app`` in ``Identity`` when the server requires a login (its owner's secret is set).

    A server started with ``auth = false`` has no logins at all: ``app`` is returned as is.
    """
    environment = os.environ if env is None else env
    owner = environment.get("PREFECT_SERVER_API_AUTH_STRING")
    home = environment.get("PREFECT_HOME")
    if not owner or not home:
        return app
    return Identity(app, owner=owner, logins=logins_path(Path(home)))
