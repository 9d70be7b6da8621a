"""Prefect's REST API over the standard library, for the commands that must answer at once.

``unattended status``, ``approvals`` and ``approve`` list, read and resume flow
runs. Importing Prefect's client costs about a second of CPU (it pulls in the
whole SDK, SQLAlchemy and the result machinery); these calls are three JSON
endpoints, stable across Prefect 3 (``POST /flow_runs/filter``,
``GET /flow_runs/{id}``, ``POST /flow_runs/{id}/resume``), so this module speaks
them directly and imports nothing of Prefect. ``tests/flows/test_fast_commands.py``
pins that.

Authentication follows Prefect's client: ``PREFECT_API_AUTH_STRING``
(``user:password``) is sent as HTTP basic auth, else ``PREFECT_API_KEY`` as a
bearer token. Call ``flows._prefect._connect.connect`` first: it sets
``PREFECT_API_URL``.

TLS follows Prefect's client too: ``PREFECT_API_SSL_CERT_FILE`` is the only CA
trusted (the local server's own certificate, ``flows._prefect._tls``), so a process
that took a dead server's port fails the handshake and is sent no header at all;
the command then says so instead of answering as if the server had.
"""

from __future__ import annotations

import base64
import http.client
import json
import random
import ssl
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit
from uuid import UUID

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    retry_if_result,
    stop_after_attempt,
    stop_after_delay,
    wait_fixed,
)

from flows._prefect._server import ServerError
from flows._prefect._tls import client_context
from policies import NotFound, UnattendedError

# Tags every campaign run carries (``flows._prefect._deployment`` sets them).
CAMPAIGN_TAG: Final = "unattended"
_TIMEOUT_SECONDS: Final = 30.0
# The run turns Suspended a moment before its form's schema is stored; an answer in
# that window is refused with this reason, so it is retried briefly.
_SCHEMA_NOT_STORED: Final = "schema not found"
_SCHEMA_WAIT_SECONDS: Final = 10.0
_SCHEMA_RETRY_SECONDS: Final = 0.25
# Prefect's client retries these statuses 5 times (PREFECT_CLIENT_MAX_RETRIES).
RETRIES: Final = 5
_BUSY: Final = frozenset({429, 502, 503})


def _backoff(state: RetryCallState) -> float:
    """Return the seconds to wait before asking again: the server's word, else 2^n/4 s."""
    outcome = state.outcome
    if outcome is not None and not outcome.failed:
        retry_after = outcome.result()[0].getheader("Retry-After")
        if retry_after is not None:
            try:
                return min(float(retry_after), 30.0)
            except ValueError:
                pass
    jitter = 1 + random.random() / 2  # noqa: S311  # spreading retries, not a secret
    return float(min(0.25 * 2 ** (state.attempt_number - 1), 8.0) * jitter)


def _busy(answer: tuple[http.client.HTTPResponse, bytes]) -> bool:
    return answer[0].status in _BUSY


def _last_answer(state: RetryCallState) -> Any:
    """Return the last answer once the retries are used up (or raise its error)."""
    return state.outcome.result()  # type: ignore[union-attr]  # set after every attempt


class ResumeRefusedError(UnattendedError):
    """The server refused the answer (invalid for the form, or the run is not suspended)."""

    code = "validation_failed"


@dataclass(frozen=True)
class RunView:
    """What the commands show of a flow run (a slice of Prefect's ``FlowRun`` JSON)."""

    id: UUID
    name: str
    state_type: str
    state_name: str
    state_message: str
    pause_key: str
    tags: tuple[str, ...] = ()
    # As the server holds them: anyone with the secret can write these (never an authority).
    parameters: Mapping[str, Any] = field(default_factory=dict)
    deployment_id: str | None = None

    @property
    def paused(self) -> bool:
        """Return whether the run waits (suspended for an approval)."""
        return self.state_type == "PAUSED"

    @property
    def campaign(self) -> str:
        """Return the campaign named by the run's ``campaign:<name>`` tag, or ``?``."""
        return next((t.split(":", 1)[1] for t in self.tags if t.startswith("campaign:")), "?")

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunView:
        """Build the view from the API's flow-run object."""
        state = data.get("state") or {}
        details = state.get("state_details") or {}
        return cls(
            id=UUID(str(data["id"])),
            name=str(data.get("name") or ""),
            state_type=str(state.get("type") or "UNKNOWN"),
            state_name=str(state.get("name") or "?"),
            state_message=str(state.get("message") or ""),
            pause_key=str(details.get("pause_key") or ""),
            tags=tuple(data.get("tags") or ()),
            parameters=dict(data.get("parameters") or {}),
            deployment_id=str(data["deployment_id"]) if data.get("deployment_id") else None,
        )


def auth_headers(env: Mapping[str, str]) -> dict[str, str]:
    """Return the ``Authorization`` header Prefect's own client would send, if any."""
    auth_string = env.get("PREFECT_API_AUTH_STRING")
    if auth_string:
        token = base64.b64encode(auth_string.encode()).decode()
        return {"Authorization": f"Basic {token}"}
    api_key = env.get("PREFECT_API_KEY")
    if api_key:
        return {"Authorization": f"Bearer {api_key}"}
    return {}


def tls_context(env: Mapping[str, str]) -> ssl.SSLContext:
    """Return the TLS context for an ``https://`` API, honouring Prefect's two TLS settings."""
    if env.get("PREFECT_API_TLS_INSECURE_SKIP_VERIFY", "").lower() in ("1", "true"):
        return ssl._create_unverified_context()  # noqa: S323  # the user asked for it, as in Prefect
    return client_context(env.get("PREFECT_API_SSL_CERT_FILE"))


def _not_the_server(url: str, env: Mapping[str, str], exc: ssl.SSLError) -> ServerError:
    """Return the error for a TLS handshake that failed: nothing was sent to ``url``."""
    cert_file = env.get("PREFECT_API_SSL_CERT_FILE")
    pinned = (
        f"the certificate in PREFECT_API_SSL_CERT_FILE ({cert_file})"
        if cert_file
        else "a certificate trusted by this system (set PREFECT_API_SSL_CERT_FILE to the "
        "server's certificate: 'unattended server cert' shows it)"
    )
    return ServerError(
        f"the process answering at {url} did not prove it is the Prefect server of "
        f"{pinned} (TLS handshake failed: {exc.reason or type(exc).__name__}); nothing was "
        "sent to it. The server may be down and its port taken by another process: ask its "
        "owner to check 'unattended server status'",
        details={"api_url": url, "reason": str(exc.reason or type(exc).__name__)},
    )


class Api:
    """A connection to ``PREFECT_API_URL`` that sends and reads JSON.

    The standard library's ``http.client``: importing httpx pulls in rich, click and
    pygments (its command line), ~0.1-0.3 s that a one-request command cannot afford.
    """

    def __init__(self, env: Mapping[str, str]) -> None:
        url = env.get("PREFECT_API_URL", "")
        if not url:
            raise ServerError("PREFECT_API_URL is not set", details={"variable": "PREFECT_API_URL"})
        self.url = url.rstrip("/")
        self._env = env
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ServerError(
                f"PREFECT_API_URL is not an http(s) URL: {self.url}",
                details={"variable": "PREFECT_API_URL"},
            )
        self._prefix = parts.path
        self._headers = {
            "Accept": "application/json",
            "Content-Type": "application/json",
            **auth_headers(env),
        }
        self._connection: http.client.HTTPConnection = (
            http.client.HTTPSConnection(
                parts.hostname, parts.port, timeout=_TIMEOUT_SECONDS, context=tls_context(env)
            )
            if parts.scheme == "https"
            else http.client.HTTPConnection(parts.hostname, parts.port, timeout=_TIMEOUT_SECONDS)
        )

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """Send one request; return the status and the decoded JSON body (None if empty).

        Like Prefect's client, a busy server (429, 502, 503: SQLite's "database is
        locked" under load) is asked again, up to ``RETRIES`` times with backoff.

        Raises:
            ServerError: The API cannot be reached, or refused the credentials.
        """
        payload = None if body is None else json.dumps(body).encode()

        def send() -> tuple[http.client.HTTPResponse, bytes]:
            try:
                # Over https the handshake comes first: headers go only to the key's holder.
                self._connection.request(
                    method, f"{self._prefix}/{path}", body=payload, headers=self._headers
                )
                response = self._connection.getresponse()
                return response, response.read()
            except ssl.SSLError as exc:
                self._connection.close()
                raise _not_the_server(self.url, self._env, exc) from exc
            except (OSError, http.client.HTTPException):
                self._connection.close()
                raise

        try:
            # Budget: RETRIES + 1 requests, on a dropped connection or a busy status; waits
            # as the server's Retry-After says (at most 30 s), else 2^n/4 s (at most 8 s).
            response, raw = Retrying(
                retry=retry_if_exception_type((ConnectionError, http.client.HTTPException))
                | retry_if_result(_busy),
                stop=stop_after_attempt(RETRIES + 1),
                wait=_backoff,
                retry_error_callback=_last_answer,
            )(send)
        except (OSError, http.client.HTTPException) as exc:
            raise ServerError(
                f"cannot reach the Prefect API at {self.url}: {type(exc).__name__}",
                details={"api_url": self.url},
            ) from exc
        if response.status == 403 and raw.startswith(b"{"):
            # The server's identity layer (flows._prefect._identity) says which rule refused.
            why = str(json.loads(raw).get("detail") or "refused")
            raise ServerError(f"the server refused: {why}", details={"status": 403})
        if response.status in (401, 403):
            raise ServerError(
                f"the Prefect API refused the credentials ({response.status}); "
                "check PREFECT_API_AUTH_STRING",
                details={"status": response.status},
            )
        return response.status, (json.loads(raw) if raw else None)

    def checked(self, method: str, path: str, body: Any = None) -> Any:
        """Like ``call``, raising ``ServerError`` for any error status."""
        status, data = self.call(method, path, body)
        if status >= 400:
            raise ServerError(
                f"the Prefect API answered {status} for {method} /{path}",
                details={"status": status},
            )
        return data

    def close(self) -> None:
        """Close the connection."""
        self._connection.close()


@contextmanager
def api(env: Mapping[str, str]) -> Iterator[Api]:
    """Yield an ``Api`` for ``PREFECT_API_URL``, closed on exit."""
    connection = Api(env)
    try:
        yield connection
    finally:
        connection.close()


def request(env: Mapping[str, str], method: str, path: str, body: Any = None) -> Any:
    """Send one request to ``PREFECT_API_URL`` (retried while the server is busy); return its JSON.

    Raises:
        ServerError: The API cannot be reached, refused the credentials or answered an error.
    """
    with api(env) as client:
        return client.checked(method, path, body)


# The most flow runs Prefect's API returns for one request (PREFECT_SERVER_API_DEFAULT_LIMIT:
# what it answers when no limit is asked; a larger one is refused), so longer lists are
# read page by page.
PAGE = 200


def filter_runs(
    env: Mapping[str, str],
    *,
    state_types: list[str] | None = None,
    deployment_ids: Collection[str] | None = None,
    limit: int | None = 50,
) -> list[RunView]:
    """Return campaign runs, newest first: at most ``limit`` (None: every one, page by page).

    ``state_types`` keeps runs in those states; ``deployment_ids`` keeps the runs of
    those deployments (a state directory's own campaigns), so other users' runs on a
    shared server neither show nor use up the limit.
    """
    flow_runs: dict[str, Any] = {"tags": {"all_": [CAMPAIGN_TAG]}}
    if state_types:
        flow_runs["state"] = {"type": {"any_": state_types}}
    if deployment_ids is not None:
        if not deployment_ids:
            # Nothing of ours to list; the server is still asked, so that a dead one, or
            # a process that took its port, is said as for any other command.
            request(env, "GET", "health")
            return []
        flow_runs["deployment_id"] = {"any_": sorted(deployment_ids)}
    found: dict[UUID, RunView] = {}
    offset = 0
    with api(env) as client:
        while limit is None or len(found) < limit:
            size = PAGE if limit is None else min(PAGE, limit - len(found))
            body = {"flow_runs": flow_runs, "sort": "START_TIME_DESC", "limit": size}
            page = client.checked("POST", "flow_runs/filter", {**body, "offset": offset})
            for item in page:
                view = RunView.from_json(item)
                found.setdefault(view.id, view)  # a run that moved between pages: once
            offset += len(page)
            if len(page) < size:
                break
    return list(found.values())


def _read(client: Api, flow_run_id: UUID) -> RunView:
    status, data = client.call("GET", f"flow_runs/{flow_run_id}")
    if status == 404:
        raise NotFound(f"no flow run {flow_run_id}", details={"flow_run_id": str(flow_run_id)})
    if status >= 400:
        raise ServerError(f"the Prefect API answered {status} for flow run {flow_run_id}")
    return RunView.from_json(data)


def read_run(env: Mapping[str, str], flow_run_id: UUID) -> RunView:
    """Return one flow run, or raise ``NotFound``."""
    with api(env) as client:
        return _read(client, flow_run_id)


def resume(env: Mapping[str, str], flow_run_id: UUID, run_input: Mapping[str, Any]) -> None:
    """Resume a suspended run with ``run_input``, exactly as the UI's form does.

    Raises:
        ResumeRefusedError: The run does not wait, or the server refused the input.
    """
    with api(env) as client:

        def answer() -> tuple[Any, str]:
            if not _read(client, flow_run_id).paused:
                raise ResumeRefusedError(
                    f"flow run {flow_run_id} is not waiting for approval",
                    details={"flow_run_id": str(flow_run_id)},
                )
            result = client.checked(
                "POST", f"flow_runs/{flow_run_id}/resume", {"run_input": dict(run_input)}
            )
            return result, str((result.get("details") or {}).get("reason") or "")

        result, reason = _until_schema_stored(lambda a: _SCHEMA_NOT_STORED in a[1].lower())(answer)
    if str(result.get("status", "")).upper() != "ACCEPT":
        raise ResumeRefusedError(
            f"the server refused the answer for flow run {flow_run_id}: {reason or 'refused'}",
            details={"flow_run_id": str(flow_run_id)},
        )


def _until_schema_stored(not_yet: Callable[[Any], bool]) -> Retrying:
    """Return the retries of a request answered ``not_yet`` while the form's schema is stored."""
    # Budget: asked again every 0.25 s for 10 s; then the last answer stands.
    return Retrying(
        retry=retry_if_result(not_yet),
        stop=stop_after_delay(_SCHEMA_WAIT_SECONDS),
        wait=wait_fixed(_SCHEMA_RETRY_SECONDS),
        retry_error_callback=_last_answer,
    )


def approve(
    env: Mapping[str, str],
    flow_run_id: UUID,
    *,
    approver: str,
    reject: bool = False,
    comment: str = "",
    batch_size: int | None = None,
    code: str | None = None,
    candidates: list[int] | None = None,
) -> None:
    """Answer a request as ``approver`` on the run's approval form (see ``resume``).

    ``code`` is the approver's one-time code, for rules that require proof;
    ``candidates`` the indices approved when approving a subset.
    """
    run_input: dict[str, Any] = {
        "decision": "reject" if reject else "approve",
        "approver": approver,
        "comment": comment,
    }
    if batch_size is not None:
        run_input["batch_size"] = batch_size
    if code is not None:
        run_input["code"] = code
    if candidates is not None:
        run_input["candidates"] = _rows_of(env, flow_run_id, candidates)
    resume(env, flow_run_id, run_input)


def _rows_of(env: Mapping[str, str], flow_run_id: UUID, indices: list[int]) -> list[Any]:
    """Return the form's Candidates choices for row numbers ``indices``.

    The form offers each row as a label (its #, coordinates and prediction) and the
    server accepts only those; the command line names rows by #, so each index is
    taken to the label at that position of the stored form (plain numbers for a form
    stored before labels existed).

    Raises:
        ResumeRefusedError: An index is not a row of the waiting batch.
    """
    with api(env) as client:

        def stored_form() -> tuple[int, Any]:
            key = f"suspended-{_read(client, flow_run_id).pause_key}-schema"
            return client.call("GET", f"flow_runs/{flow_run_id}/input/{key}")

        status, stored = _until_schema_stored(lambda a: a[0] >= 400)(stored_form)
    # The API answers with the stored value itself: the schema, as JSON.
    schema = json.loads(stored) if isinstance(stored, str) else stored
    if status >= 400 or not isinstance(schema, dict):
        return list(indices)  # resume says why the run cannot take an answer
    field = (schema.get("properties") or {}).get("candidates") or {}
    labels = (field.get("items") or {}).get("enum")
    if not isinstance(labels, list):
        return list(indices)
    outside = [i for i in indices if not 0 <= i < len(labels)]
    if outside:
        raise ResumeRefusedError(
            f"refused the answer before sending it: candidates: {outside[0]} is not a row "
            f"of the batch (#0 to #{len(labels) - 1})",
            details={"field": "candidates", "flow_run_id": str(flow_run_id)},
        )
    return [labels[i] for i in indices]
