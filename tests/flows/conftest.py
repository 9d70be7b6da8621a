"""Receivers for notification tests: a webhook (http.server) and an SMTP server (aiosmtpd).

Both listen on 127.0.0.1, on ports of their own, and are stopped after the test.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass
class Webhook:
    """What a Slack/Mattermost-style incoming webhook received."""

    url: str
    posts: list[dict[str, Any]] = field(default_factory=list)


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    """Run an incoming-webhook receiver on 127.0.0.1 that keeps every JSON body."""
    received: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            received.append(json.loads(self.rfile.read(length)))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Webhook(f"http://127.0.0.1:{server.server_address[1]}/hooks/abc", received)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@dataclass
class Mailbox:
    """What an SMTP server received."""

    port: int
    messages: list[Message] = field(default_factory=list)


@pytest.fixture
def mailbox() -> Iterator[Mailbox]:
    """Run an SMTP server (aiosmtpd) on 127.0.0.1 that keeps every message."""
    from aiosmtpd.controller import Controller

    box = Mailbox(port=closed_port())

    class Handler:
        async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
            box.messages.append(message_from_bytes(envelope.content))
            return "250 OK"

    controller = Controller(Handler(), hostname="127.0.0.1", port=box.port)
    controller.start()
    try:
        yield box
    finally:
        controller.stop()


def closed_port() -> int:
    """Return a port on 127.0.0.1 that nothing listens on (a receiver that is down)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
