"""The runner wakes on Prefect's event stream, and keeps polling when the stream is away.

Real Prefect server (the session's, auth on): the stream is the same websocket the
UI listens to. ``tests/reliability/crash/test_recovery.py::TestResumedFromTheUI``
drives the whole path (a runner polling hourly, a resume from the form's API).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid

import pytest
from prefect.client.schemas.objects import FlowRun
from prefect.settings import PREFECT_API_URL, temporary_settings

from flows._prefect._rest import request
from flows._prefect._runner import wake_on_events
from flows._prefect._server import ServerHandle

pytestmark = [pytest.mark.integration, pytest.mark.asyncio, pytest.mark.timeout(120)]


async def _never(run: FlowRun) -> None:
    raise AssertionError(f"no stream, no run: {run.id}")


def _scheduled_run(tag: str) -> str:
    flow = request(os.environ, "POST", "flows/", {"name": f"events-{uuid.uuid4().hex[:8]}"})
    run = request(
        os.environ,
        "POST",
        "flow_runs/",
        {"flow_id": flow["id"], "tags": [tag], "state": {"type": "SCHEDULED"}},
    )
    return str(run["id"])


async def test_a_due_run_wakes_it_once_the_run_reads_scheduled(
    prefect_server: ServerHandle,
) -> None:
    """The wake comes after the state is committed, so the runner's poll finds the run."""
    tag = f"events-{uuid.uuid4().hex[:8]}"
    listening = asyncio.Event()
    due: asyncio.Queue[FlowRun] = asyncio.Queue()
    listener = asyncio.create_task(wake_on_events(due.put, tag=tag, on_listening=listening.set))
    try:
        await asyncio.wait_for(listening.wait(), 60)
        run = await asyncio.to_thread(_scheduled_run, tag)
        seen = await asyncio.wait_for(due.get(), 60)
        assert str(seen.id) == run
        assert seen.state is not None
        assert seen.state.is_scheduled()
    finally:
        listener.cancel()
        with pytest.raises(asyncio.CancelledError):
            await listener


async def test_runs_of_other_tags_do_not_wake_it(prefect_server: ServerHandle) -> None:
    """Only the campaign's own runs count: a busy shared server does not make it spin."""
    ours, theirs = f"events-{uuid.uuid4().hex[:8]}", f"other-{uuid.uuid4().hex[:8]}"
    listening = asyncio.Event()
    due: asyncio.Queue[FlowRun] = asyncio.Queue()
    listener = asyncio.create_task(wake_on_events(due.put, tag=ours, on_listening=listening.set))
    try:
        await asyncio.wait_for(listening.wait(), 60)
        await asyncio.to_thread(_scheduled_run, theirs)
        run = await asyncio.to_thread(_scheduled_run, ours)  # announced after theirs
        seen = await asyncio.wait_for(due.get(), 60)
        assert str(seen.id) == run
        assert due.empty()
    finally:
        listener.cancel()


async def test_without_the_stream_it_warns_once_keeps_trying_and_stops_when_cancelled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    caplog.set_level(logging.DEBUG, logger="flows._prefect._runner")
    tried = asyncio.Event()

    class Count(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen = [r for r in caplog.records if "stream is unavailable" in r.getMessage()]
            if len(seen) >= 3:
                tried.set()

    counter = Count()
    logging.getLogger("flows._prefect._runner").addHandler(counter)

    with temporary_settings({PREFECT_API_URL: f"http://127.0.0.1:{closed}/api"}):
        listener = asyncio.create_task(wake_on_events(_never, tag="unattended", retry_seconds=0.01))
        try:
            await asyncio.wait_for(tried.wait(), 60)
            assert not listener.done()
            listener.cancel()
            with pytest.raises(asyncio.CancelledError):
                await listener
        finally:
            logging.getLogger("flows._prefect._runner").removeHandler(counter)
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1, [r.getMessage() for r in warned]
    assert "polling" in warned[0].getMessage()
