"""The server runs a request again while Prefect answers it 503 (flows._prefect._server_main).

The unit tests drive ``RetryBusy`` with small ASGI apps; the last test provokes the
real thing on the session's server: a write lock held on Prefect's SQLite database
makes its DEFERRED ``create_deployment`` transaction fail at once with "database is
locked", which Prefect answers 503 (its client would wait 2 s, then 4 s...).
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import uuid
from typing import Any

import httpx
import pytest

from flows._prefect._server import ServerHandle
from flows._prefect._server_main import BUSY_RETRY_SECONDS, RETRIED_HEADER, RetryBusy

Message = dict[str, Any]


class Flaky:
    """An ASGI app that answers 503 ``failures`` times, then 200 with the body it got."""

    def __init__(self, failures: int, *, raise_after_503: bool = False) -> None:
        self.failures = failures
        self.raise_after_503 = raise_after_503
        self.bodies: list[bytes] = []
        self.paths: list[str] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.paths.append(scope["path"])
        scope["path"] = "/rewritten"  # what a Starlette mount does to the scope
        message = await receive()
        self.bodies.append(message["body"])
        if len(self.bodies) <= self.failures:
            await send({"type": "http.response.start", "status": 503, "headers": []})
            await send({"type": "http.response.body", "body": b"busy"})
            if self.raise_after_503:  # Starlette's ServerErrorMiddleware re-raises
                raise RuntimeError("database is locked")
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"got " + message["body"]})


async def _post(app: Any, body: bytes = b'{"n": 1}') -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://server") as client:
        return await client.post("/api/deployments/", content=body)


def test_a_503_is_run_again_with_the_same_request_until_it_succeeds() -> None:
    app = Flaky(failures=2)
    middleware = RetryBusy(app, first_delay=0.001)
    response = asyncio.run(_post(middleware))
    assert response.status_code == 200
    assert response.text == 'got {"n": 1}'
    assert response.headers[RETRIED_HEADER.decode()] == "2"
    assert app.bodies == [b'{"n": 1}'] * 3
    assert app.paths == ["/api/deployments/"] * 3  # each run gets the scope as it came
    assert middleware.retried == 2


def test_the_error_starlette_raises_after_its_503_is_dropped_with_that_answer() -> None:
    app = Flaky(failures=1, raise_after_503=True)
    response = asyncio.run(_post(RetryBusy(app, first_delay=0.001)))
    assert response.status_code == 200
    assert len(app.bodies) == 2


def test_a_503_that_lasts_past_the_budget_reaches_the_client() -> None:
    app = Flaky(failures=10_000)
    middleware = RetryBusy(app, budget=0.05, first_delay=0.005, max_delay=0.01)
    response = asyncio.run(_post(middleware))
    assert response.status_code == 503
    assert response.text == "busy"
    assert 2 <= len(app.bodies) < 50
    assert response.headers[RETRIED_HEADER.decode()] == str(len(app.bodies) - 1)


def test_the_last_503_keeps_its_error_for_the_server_to_log() -> None:
    app = Flaky(failures=10_000, raise_after_503=True)
    middleware = RetryBusy(app, budget=0.0)
    with pytest.raises(RuntimeError, match="locked"):
        asyncio.run(_post(middleware))
    assert len(app.bodies) == 1


def test_other_answers_pass_once_and_a_stream_stays_a_stream() -> None:
    sent: list[Message] = []

    async def streaming(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 500, "headers": []})
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        await send({"type": "http.response.body", "body": b"b"})

    async def request() -> None:
        messages = iter([{"type": "http.request", "body": b"x", "more_body": False}])

        async def receive() -> Message:
            return next(messages)

        async def send(message: Message) -> None:
            sent.append(message)

        await RetryBusy(streaming)({"type": "http", "path": "/"}, receive, send)

    asyncio.run(request())
    assert [m.get("body") for m in sent] == [None, b"a", b"b"]
    assert sent[0]["status"] == 500
    assert all(RETRIED_HEADER not in dict(m.get("headers", [])) for m in sent)


def test_a_body_in_chunks_is_given_whole_and_a_client_gone_is_not_answered() -> None:
    app = Flaky(failures=1)

    async def request(messages: list[Message]) -> list[Message]:
        pending = iter(messages)
        sent: list[Message] = []

        async def receive() -> Message:
            return next(pending)

        async def send(message: Message) -> None:
            sent.append(message)

        await RetryBusy(app, first_delay=0.001)({"type": "http", "path": "/"}, receive, send)
        return sent

    chunks = [
        {"type": "http.request", "body": b"ab", "more_body": True},
        {"type": "http.request", "body": b"cd", "more_body": False},
    ]
    sent = asyncio.run(request(chunks))
    assert app.bodies == [b"abcd", b"abcd"]
    assert sent[-1]["body"] == b"got abcd"
    gone = asyncio.run(request([chunks[0], {"type": "http.disconnect"}]))
    assert gone == []
    assert len(app.bodies) == 2  # the app never saw the request of a client that left


def test_lifespan_and_websocket_pass_through() -> None:
    seen: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope["type"])
        assert await receive() == {"type": scope["type"] + ".marker"}

    async def run(kind: str) -> None:
        async def receive() -> Message:
            return {"type": kind + ".marker"}

        async def send(message: Message) -> None:
            raise AssertionError("nothing is sent")

        await RetryBusy(app)({"type": kind}, receive, send)

    asyncio.run(run("lifespan"))
    asyncio.run(run("websocket"))
    assert seen == ["lifespan", "websocket"]


RESUME = "/api/flow_runs/5f0c/resume"


def test_a_person_s_resume_is_run_again_past_the_budget_of_other_requests() -> None:
    """The UI's Resume gets 30 s where other requests get 3 s (here 0.02 s and 5 s)."""

    async def both() -> tuple[httpx.Response, httpx.Response]:
        slow = Flaky(failures=10_000)
        other = RetryBusy(slow, budget=0.02, first_delay=0.005, max_delay=0.01)
        deployments = await _post(other)
        resumed = Flaky(failures=12)
        person = RetryBusy(
            resumed, budget=0.02, human_budget=5.0, first_delay=0.005, max_delay=0.01
        )
        transport = httpx.ASGITransport(app=person)
        async with httpx.AsyncClient(transport=transport, base_url="http://server") as client:
            return deployments, await client.post(RESUME, content=b"{}")

    deployments, resume = asyncio.run(both())
    assert deployments.status_code == 503
    assert resume.status_code == 200
    assert resume.headers[RETRIED_HEADER.decode()] == "12"


def test_a_read_is_never_held_back_by_a_person_s_answer() -> None:
    """A GET arriving while the resume holds the floor runs at once."""
    calls: list[str] = []
    first_503 = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        status = 503 if scope["path"] == RESUME and calls.count(RESUME) < 3 else 200
        calls.append(scope["path"])
        if status == 503:
            first_503.set()
            await asyncio.sleep(0.05)  # the resume's transaction takes its time
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def scenario() -> None:
        middleware = RetryBusy(app, first_delay=0.001, max_delay=0.002)
        transport = httpx.ASGITransport(app=middleware)
        async with httpx.AsyncClient(transport=transport, base_url="http://server") as client:
            resume = asyncio.create_task(client.post(RESUME, content=b"{}"))
            await first_503.wait()
            assert (await client.get("/api/flow_runs/5f0c")).status_code == 200
            assert (await resume).status_code == 200

    asyncio.run(scenario())
    assert calls.index("/api/flow_runs/5f0c") < len(calls) - 1  # before the resume's answer


def test_a_person_s_budget_is_at_least_the_others_and_none_without_retries() -> None:
    assert RetryBusy(Flaky(0), budget=3.0).human_budget == 30.0
    assert RetryBusy(Flaky(0), budget=45.0).human_budget == 45.0
    assert RetryBusy(Flaky(0), budget=0.0).human_budget == 0.0
    assert RetryBusy(Flaky(0), budget=3.0, human_budget=0.0).human_budget == 0.0


def test_without_a_person_s_budget_a_resume_is_a_request_like_any_other() -> None:
    app = Flaky(failures=10_000)
    middleware = RetryBusy(app, budget=0.02, human_budget=0.0, first_delay=0.005, max_delay=0.01)

    async def resume() -> httpx.Response:
        transport = httpx.ASGITransport(app=middleware)
        async with httpx.AsyncClient(transport=transport, base_url="http://server") as client:
            return await client.post(RESUME, content=b"{}")

    assert asyncio.run(resume()).status_code == 503
    assert len(app.bodies) < 10


def test_while_a_person_s_answer_is_run_again_other_requests_wait_to_start() -> None:
    """Once the resume met a 503, a request arriving after it runs only once it is answered.

    And before running again, the resume waits for a request already running to end.
    """
    calls: list[tuple[str, int]] = []
    first_503 = asyncio.Event()
    release_long = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        path = scope["path"]
        if path == "/api/long/":  # already running when the resume meets its 503
            await release_long.wait()
        status = 503 if path == RESUME and calls.count((RESUME, 503)) < 3 else 200
        calls.append((path, status))
        if status == 503:
            first_503.set()
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def scenario() -> list[int]:
        middleware = RetryBusy(app, first_delay=0.001, max_delay=0.002, drain=5.0)
        transport = httpx.ASGITransport(app=middleware)
        async with httpx.AsyncClient(transport=transport, base_url="http://server") as client:
            long = asyncio.create_task(client.post("/api/long/", content=b"{}"))
            await asyncio.sleep(0)  # the long request is in the app
            resume = asyncio.create_task(client.post(RESUME, content=b"{}"))
            await first_503.wait()
            later = asyncio.create_task(client.post("/api/deployments/", content=b"{}"))
            await asyncio.sleep(0.05)
            release_long.set()
            answers = await asyncio.gather(long, resume, later)
        return [answer.status_code for answer in answers]

    assert asyncio.run(scenario()) == [200, 200, 200]
    # The resume ran again only after the long request ended; the later one after the resume.
    assert calls == [
        (RESUME, 503),
        ("/api/long/", 200),
        (RESUME, 503),
        (RESUME, 503),
        (RESUME, 200),
        ("/api/deployments/", 200),
    ]


@pytest.mark.integration
def test_the_real_server_answers_through_a_locked_database(prefect_server: ServerHandle) -> None:
    """Prefect answers 503 while another connection holds the write lock; no client sees it.

    When a request met the lock is read from its answer (the retries header), not
    hoped for after a sleep: a request that got through before the lock was taken, or
    after it was let go, is sent again with the lock held longer, each time answered
    201, until one shows it met the lock. Every hold stays under the server's retry
    budget, so a 503 reaching the client would be a failure of the retry.
    """
    assert prefect_server.auth_string is not None
    user, secret = prefect_server.auth_string.split(":", 1)
    api = httpx.Client(
        base_url=prefect_server.api_url,
        auth=(user, secret),
        timeout=60,
        verify=prefect_server.verify(),
    )
    flow = api.post("/flows/", json={"name": f"busy-{uuid.uuid4().hex[:8]}"}).json()
    try:
        for hold in (0.25, 0.5, 1.0, 1.5, 2.0, 2.0, 2.0, 2.0):
            assert hold < BUSY_RETRY_SECONDS
            answer = _create_while_locked(prefect_server, api, flow["id"], hold)
            assert answer.status_code == 201, answer.text  # plain httpx: a 503 would show here
            if RETRIED_HEADER.decode() in answer.headers:
                break
        else:
            pytest.fail("no request met the held lock in eight tries")
    finally:
        api.close()
    assert int(answer.headers[RETRIED_HEADER.decode()]) >= 1


def _create_while_locked(
    server: ServerHandle, api: httpx.Client, flow_id: str, hold: float
) -> httpx.Response:
    """Create a deployment while a write lock is held for ``hold`` s from its sending."""
    answers: list[httpx.Response] = []

    def create_deployment() -> None:
        name = f"busy-{uuid.uuid4().hex[:8]}"
        answers.append(api.post("/deployments/", json={"name": name, "flow_id": flow_id}))

    lock = sqlite3.connect(server.prefect_home / "prefect.db", isolation_level=None)
    caller = threading.Thread(target=create_deployment)
    try:
        lock.execute("BEGIN IMMEDIATE")  # the write lock, as another writer holds it
        caller.start()
        caller.join(timeout=hold)  # it cannot end while the lock is held, unless it missed it
    finally:
        lock.execute("COMMIT")
        lock.close()
    caller.join(timeout=60)
    (answer,) = answers
    return answer
