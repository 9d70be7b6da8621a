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


@pytest.fixture
def suspend_demo(prefect_server: Any) -> Any:
    """Return ``suspend(folder, name) -> flow run id``: the demo approval campaign, suspended.

    A copy of ``examples/demo`` in ``folder``, named ``name``, whose policy asks on round
    0 (to be quick), is submitted and run by a runner of ``folder/home`` until it waits.
    """
    import asyncio
    import shutil
    from pathlib import Path

    from flows._prefect._deployment import submit_campaign
    from flows._prefect._service import CampaignService, read_run

    examples = Path(__file__).resolve().parents[2] / "examples" / "demo"

    def suspend(folder: Path, name: str) -> str:
        for item in examples.iterdir():
            shutil.copy(item, folder / item.name)
        spec = folder / "campaign-approval.toml"
        spec.write_text(spec.read_text().replace('name = "demo-approval"', f'name = "{name}"'))
        policy = folder / "approval-policy.toml"
        policy.write_text(policy.read_text().replace("round.index == 2", "round.index == 0"))
        home = folder / "home"

        async def until_suspended() -> str:
            submitted = await submit_campaign(spec, state_dir=home)
            await CampaignService(query_seconds=0.5, state_dir=home).run_once()
            run = await read_run(submitted.flow_run_id)
            assert run.state is not None
            assert run.state.type.value == "PAUSED"
            return str(submitted.flow_run_id)

        return asyncio.run(until_suspended())

    return suspend
