"""``LLMPlanner`` against a real OpenAI-compatible HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from acceptance import Rejected, accept
from policies import ProviderError
from tasks import Bounds, LLMPlanner, Proposal, planner_checks

CANARY = "sk-canary-7f3a9c1e5b"
UNIT2 = Bounds.unit(2)
GOOD = [[0.1, 0.2], [0.3, 0.4], [0.5, 0.6], [0.7, 0.8]]


def completion(
    content: str | None, *, finish_reason: str = "stop", refusal: str | None = None, id: str = "c1"
) -> dict[str, Any]:
    """Return a chat-completions response body."""
    message = {"role": "assistant", "content": content, "refusal": refusal}
    return {
        "id": id,
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
    }


def answer(
    candidates: list[list[float]], rationale: str = "spread out", **kw: Any
) -> dict[str, Any]:
    return completion(json.dumps({"rationale": rationale, "candidates": candidates}), **kw)


class ModelServer:
    """A chat-completions endpoint that plays scripted replies and records requests.

    A reply is ``("json", status, body)``, ``("raw", status, bytes)`` or
    ``("hang",)``: hold the request open until the server stops.
    """

    def __init__(self) -> None:
        self.replies: list[tuple[Any, ...]] = []
        self.requests: list[dict[str, Any]] = []
        self.release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                server.requests.append(
                    {"path": self.path, "headers": dict(self.headers), "body": body}
                )
                reply = server.replies.pop(0) if server.replies else ("json", 500, {})
                try:
                    if reply[0] == "hang":
                        server.release.wait(30)
                        return
                    data = reply[2] if reply[0] == "raw" else json.dumps(reply[2]).encode()
                    self.send_response(reply[1])
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up (the timeout test); nothing to answer

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep the test output clean

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )

    def __enter__(self) -> ModelServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)


@pytest.fixture
def server() -> Iterator[ModelServer]:
    with ModelServer() as running:
        yield running


def planner(url: str, **kw: Any) -> LLMPlanner:
    settings: dict[str, Any] = {
        "api_key": CANARY,
        "count": 4,
        "bounds": UNIT2,
        "objective": "the demo valley",
        "timeout": 5.0,
        "max_tokens": 256,
    }
    settings.update(kw)
    return LLMPlanner(url, "demo-model", **settings)


def assert_no_canary(exc: BaseException) -> None:
    texts = [str(exc), repr(exc)]
    if isinstance(exc, ProviderError):
        texts.append(json.dumps(exc.to_dict()))
    assert not any(CANARY in text for text in texts)


class TestRequest:
    @pytest.mark.asyncio
    async def test_posts_chat_completions_with_a_strict_schema(self, server: ModelServer) -> None:
        server.replies.append(("json", 200, answer(GOOD)))
        await planner(server.url)(())
        request = server.requests[0]
        assert request["path"] == "/v1/chat/completions"
        body = request["body"]
        assert body["model"] == "demo-model"
        assert body["temperature"] == 0
        assert body["max_tokens"] == 256
        fmt = body["response_format"]
        assert fmt["type"] == "json_schema"
        assert fmt["json_schema"]["name"] == "proposal"
        assert fmt["json_schema"]["strict"] is True
        assert list(fmt["json_schema"]["schema"]["properties"]) == ["rationale", "candidates"]

    @pytest.mark.asyncio
    async def test_api_key_goes_in_the_authorization_header(self, server: ModelServer) -> None:
        server.replies.append(("json", 200, answer(GOOD)))
        await planner(server.url, api_key=SecretStr(CANARY))(())
        headers = server.requests[0]["headers"]
        assert headers["Authorization"] == f"Bearer {CANARY}"
        assert CANARY not in json.dumps(server.requests[0]["body"])

    @pytest.mark.asyncio
    async def test_no_key_means_no_authorization_header(self, server: ModelServer) -> None:
        server.replies.append(("json", 200, answer(GOOD)))
        await planner(server.url, api_key=None)(())
        assert "Authorization" not in server.requests[0]["headers"]

    @pytest.mark.asyncio
    async def test_observations_appear_in_the_prompt(self, server: ModelServer) -> None:
        server.replies.append(("json", 200, answer(GOOD)))
        model = planner(server.url)
        model.observe([[0.25, 0.75], [0.5, 0.5]], [3.5, float("nan")])
        await model(())
        prompt = server.requests[0]["body"]["messages"][1]["content"]
        assert "[0.25, 0.75] -> 3.5" in prompt
        assert "nan" not in prompt

    @pytest.mark.asyncio
    async def test_a_given_client_is_used_and_left_open(self, server: ModelServer) -> None:
        server.replies.append(("json", 200, answer(GOOD)))
        async with httpx.AsyncClient() as client:
            await planner(server.url, client=client)(())
            assert not client.is_closed
        assert len(server.requests) == 1


class TestAnswers:
    @pytest.mark.asyncio
    async def test_valid_answer_becomes_a_proposal_with_the_response_id(
        self, server: ModelServer
    ) -> None:
        server.replies.append(("json", 200, answer(GOOD, id="chatcmpl-42")))
        proposal = await planner(server.url)(())
        assert proposal == Proposal(
            rationale="spread out", candidates=GOOD, response_id="chatcmpl-42"
        )

    @pytest.mark.asyncio
    async def test_refusal_is_rejected(self, server: ModelServer) -> None:
        server.replies.append(("json", 200, completion(None, refusal="I cannot help with that")))
        with pytest.raises(Rejected) as caught:
            await planner(server.url)(())
        assert caught.value.check == "refusal"
        assert "cannot help" not in caught.value.reason

    @pytest.mark.asyncio
    async def test_truncation_is_rejected(self, server: ModelServer) -> None:
        server.replies.append(
            ("json", 200, completion('{"rationale": "long', finish_reason="length"))
        )
        with pytest.raises(Rejected, match="max_tokens=256") as caught:
            await planner(server.url)(())
        assert caught.value.check == "truncation"

    @pytest.mark.asyncio
    async def test_garbage_is_a_schema_rejection_without_the_answer(
        self, server: ModelServer
    ) -> None:
        server.replies.append(("json", 200, completion("SECRET-PLAN here is my batch")))
        with pytest.raises(Rejected, match="Invalid JSON") as caught:
            await planner(server.url)(())
        assert caught.value.check == "schema"
        assert "SECRET-PLAN" not in caught.value.reason

    @pytest.mark.asyncio
    async def test_invalid_fields_are_named_by_path(self, server: ModelServer) -> None:
        content = json.dumps({"rationale": "r", "candidates": [[0.1, "SECRET-PLAN"]]})
        server.replies.append(("json", 200, completion(content)))
        with pytest.raises(
            Rejected, match=r"candidates\.0\.1: Input should be a valid number"
        ) as c:
            await planner(server.url)(())
        assert "SECRET-PLAN" not in c.value.reason

    @pytest.mark.asyncio
    async def test_a_fenced_answer_is_read(self, server: ModelServer) -> None:
        content = "```json\n" + json.dumps({"rationale": "r", "candidates": GOOD}) + "\n```"
        server.replies.append(("json", 200, completion(content)))
        assert (await planner(server.url)(())).candidates == GOOD


class TestProviderFailures:
    @pytest.mark.asyncio
    @pytest.mark.parametrize(
        ("status", "retryable"), [(500, True), (503, True), (429, True), (400, False), (401, False)]
    )
    async def test_http_errors_are_provider_errors_with_the_status(
        self, server: ModelServer, status: int, retryable: bool
    ) -> None:
        server.replies.append(("json", status, {"error": {"message": "nope"}}))
        with pytest.raises(ProviderError, match=f"HTTP {status}") as caught:
            await planner(server.url)(())
        assert caught.value.code == "provider_error"
        assert caught.value.details["status_code"] == status
        assert caught.value.retryable is retryable
        assert_no_canary(caught.value)

    @pytest.mark.asyncio
    async def test_hanging_endpoint_times_out(self, server: ModelServer) -> None:
        server.replies.append(("hang",))
        with pytest.raises(ProviderError, match=r"did not answer within 0\.3 s") as caught:
            await planner(server.url, timeout=0.3)(())
        assert caught.value.details["status_code"] is None
        assert_no_canary(caught.value)

    @pytest.mark.asyncio
    async def test_connection_refused_is_a_provider_error(self) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        with pytest.raises(ProviderError, match="unreachable") as caught:
            await planner(f"http://127.0.0.1:{port}/v1")(())
        assert caught.value.details["cause"] == "ConnectError"
        assert_no_canary(caught.value)

    @pytest.mark.asyncio
    async def test_a_body_that_is_not_json_is_a_provider_error(self, server: ModelServer) -> None:
        server.replies.append(("raw", 200, b"<html>gateway</html>"))
        with pytest.raises(ProviderError, match="not JSON"):
            await planner(server.url)(())

    @pytest.mark.asyncio
    @pytest.mark.parametrize(
        "body", [{}, {"choices": []}, {"choices": [{"message": "hi"}]}, [1, 2]]
    )
    async def test_malformed_envelope_is_a_provider_error(
        self, server: ModelServer, body: Any
    ) -> None:
        server.replies.append(("json", 200, body))
        with pytest.raises(ProviderError, match="malformed chat-completions response"):
            await planner(server.url)(())

    @pytest.mark.asyncio
    async def test_the_key_never_reaches_logs_or_reprs(
        self, server: ModelServer, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.DEBUG)
        server.replies.extend([("json", 200, answer(GOOD)), ("json", 500, {})])
        model = planner(server.url)
        await model(())
        with pytest.raises(ProviderError) as caught:
            await model(())
        assert CANARY not in repr(model)
        assert CANARY not in caplog.text
        assert_no_canary(caught.value)


class TestWithTheGate:
    @pytest.mark.asyncio
    async def test_reask_carries_each_rejection_and_its_reason(self, server: ModelServer) -> None:
        nan_batch = completion(
            '{"rationale": "a", "candidates": [[NaN, 0.2], [0.3, 0.4], [0.5, 0.6], [0.7, 0.8]]}'
        )
        outside = answer([[0.1, 0.2], [0.3, 1.4], [0.5, 0.6], [0.7, 0.8]], rationale="b")
        server.replies.extend(
            [
                ("json", 200, nan_batch),
                ("json", 200, completion(None, refusal="no")),
                ("json", 200, outside),
                ("json", 200, answer(GOOD, id="final")),
            ]
        )
        outcome = await accept(
            planner(server.url),
            checks=planner_checks(UNIT2, 4),
            attempts=4,
            name="planner",
        )
        assert outcome.disposition == "accepted"
        assert outcome.value.response_id == "final"
        assert [a.rejected_by for a in outcome.attempts] == [
            "finite",
            "refusal",
            "within_bounds",
            None,
        ]
        last = server.requests[-1]["body"]["messages"]
        roles = [m["role"] for m in last]
        assert roles == [
            "system",
            "user",
            "assistant",
            "user",
            "assistant",
            "user",
            "assistant",
            "user",
        ]
        assert "NaN" in last[2]["content"]
        assert (
            "rejected by the finite check: not finite: candidate 0 coordinate 0 is nan"
            in last[3]["content"]
        )
        assert "attempt 2 gave no usable proposal" in last[4]["content"]
        assert "rejected by the refusal check" in last[5]["content"]
        assert json.loads(last[6]["content"])["rationale"] == "b"
        assert "candidate 1 coordinate 1 = 1.4 outside [0.0, 1.0]" in last[7]["content"]

    @pytest.mark.asyncio
    async def test_provider_error_stops_the_gate_at_once(self, server: ModelServer) -> None:
        server.replies.extend([("json", 502, {}), ("json", 200, answer(GOOD))])
        with pytest.raises(ProviderError):
            await accept(
                planner(server.url),
                checks=planner_checks(UNIT2, 4),
                attempts=3,
                fallback=lambda: Proposal(rationale="fallback", candidates=GOOD),
                name="planner",
            )
        assert len(server.requests) == 1
