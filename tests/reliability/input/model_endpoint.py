"""A scripted OpenAI-compatible chat-completions endpoint on 127.0.0.1, for campaign tests.

``ModelEndpoint(script)`` calls ``script(n, body)`` for the n-th request (from 0)
and sends what it returns: ``(status, payload)`` with a JSON-able payload or raw
``bytes``, or ``HANG`` to hold the request open until the endpoint stops. Every
request's headers and body are kept in ``requests``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HANG = "hang"

Reply = tuple[int, Any] | str
Script = Callable[[int, dict[str, Any]], Reply]


def completion(
    content: str | None,
    *,
    finish_reason: str = "stop",
    refusal: str | None = None,
    response_id: str = "chatcmpl-test",
) -> dict[str, Any]:
    """Return a chat-completions response body."""
    return {
        "id": response_id,
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "refusal": refusal},
                "finish_reason": finish_reason,
            }
        ],
    }


def batch_answer(candidates: Any, rationale: str = "spread out") -> dict[str, Any]:
    """Return a completion whose content is a proposal of ``candidates``."""
    return completion(json.dumps({"rationale": rationale, "candidates": candidates}))


def grid(count: int, dim: int, shift: float = 0.0) -> list[list[float]]:
    """Return ``count`` distinct points in the unit cube (deterministic)."""
    return [
        [
            round((0.05 + 0.9 * ((i + 1) / (count + 1)) + shift * (d + 1)) % 1.0, 6)
            for d in range(dim)
        ]
        for i in range(count)
    ]


class ModelEndpoint:
    """A chat-completions server that answers from a script and records requests."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[dict[str, Any]] = []
        self.release = threading.Event()
        self._lock = threading.Lock()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                with endpoint._lock:
                    n = len(endpoint.requests)
                    endpoint.requests.append({"headers": dict(self.headers), "body": body})
                reply = endpoint.script(n, body)
                try:
                    if reply == HANG:
                        endpoint.release.wait(120)
                        return
                    assert isinstance(reply, tuple)
                    status, payload = reply
                    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up (a timeout); nothing to answer

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep test output clean

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self) -> ModelEndpoint:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)
