"""The engine's event loop never blocks on its store or its notices (issue 46).

The store is awaited through one adapter (``StoreThread``: each call in one worker
thread, in the order issued); notices are queued to one sender (``NoticeSender``).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import shutil
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from flows._engine._notify import NoticeSender, Notifier
from flows._engine._store import AsyncCampaignStore, CampaignStore
from flows._engine._store_thread import StoreThread
from flows._provenance import CampaignFenced, ProvenanceStore
from flows._provenance._writes import Fence
from tasks import AllocationExecutor, ExecutableTask, NotifyConfig, load_site

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "demo"
# How long a test's slow write waits for what it expects before giving up (never reached
# when the loop runs on; on a loop the write blocks, the write gives up and the test fails).
PATIENCE_SECONDS = 20.0


def _protocol_methods(protocol: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in vars(protocol).items()
        if not name.startswith("_") and callable(member)
    }


class TestTheAwaitedStore:
    def test_it_has_every_call_of_the_store_with_the_same_arguments_and_result(self):
        sync = _protocol_methods(CampaignStore)
        awaited = _protocol_methods(AsyncCampaignStore)
        assert set(sync) == set(awaited)
        assert len(sync) == 17
        for name, signature in sync.items():
            assert inspect.iscoroutinefunction(getattr(AsyncCampaignStore, name)), name
            assert awaited[name] == signature, name

    @pytest.mark.asyncio
    async def test_calls_run_in_one_thread_in_the_order_issued(self):
        seen: list[tuple[str, int]] = []

        class Recorder:
            def note(self, what: str) -> str:
                seen.append((what, threading.get_ident()))
                return what

        thread = StoreThread(Recorder())  # type: ignore[type-var]  # a recorder, not a store
        async with thread:
            for i in range(20):
                thread.later(thread.store.note, f"queued {i}")
            assert await thread.note("awaited") == "awaited"
            assert thread.blocking.note("blocking") == "blocking"  # type: ignore[attr-defined]
        assert [what for what, _ in seen] == [
            *(f"queued {i}" for i in range(20)),
            "awaited",
            "blocking",
        ]
        assert len({ident for _, ident in seen}) == 1
        assert seen[0][1] != threading.get_ident()  # not the event loop's thread

    @pytest.mark.asyncio
    async def test_a_fenced_write_raises_the_stores_own_error(self, tmp_path: Path):
        store = ProvenanceStore.open(tmp_path)
        store.ensure_campaign("c", spec={}, site="local", seed=1, code_version="t")
        store.fence = Fence("c", "a token nobody holds")
        try:
            async with StoreThread(store) as writes:
                with pytest.raises(CampaignFenced) as raised:
                    await writes.set_campaign_status("c", "running")
            assert "no longer holds its lease" in raised.value.message
        finally:
            store.close()

    @pytest.mark.asyncio
    async def test_closing_waits_for_every_queued_call(self, tmp_path: Path):
        store = ProvenanceStore.open(tmp_path)
        store.ensure_campaign("c", spec={}, site="local", seed=1, code_version="t")
        try:
            async with StoreThread(store) as writes:
                for i in range(5):
                    writes.later(store.record_event, "c", "noted", details={"i": i})
            with store.engine.connect() as connection:
                rows = connection.exec_driver_sql(
                    "SELECT details FROM campaign_event WHERE kind = 'noted' ORDER BY id"
                ).all()
            assert [json.loads(row.details)["i"] for row in rows] == list(range(5))
        finally:
            store.close()


class SlowWrites:
    """A real store whose ``method`` holds on until ``enough`` says it may go on (test-only).

    ``enough(None)`` is read when the write begins; ``enough(began)`` returns
    ``(may_go_on, what_it_saw)``, polled until it may (at most ``PATIENCE_SECONDS``);
    the write then goes through, and ``saw`` keeps what was seen last.
    """

    def __init__(self, store: ProvenanceStore, method: str, enough: Any) -> None:
        self._store = store
        self._method = method
        self._enough = enough
        self.saw: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._store, name)
        if name != self._method:
            return target

        def slow(*args: Any, **kwargs: Any) -> Any:
            began = self._enough(None)
            deadline = time.monotonic() + PATIENCE_SECONDS
            go_on, seen = self._enough(began)
            while not go_on and time.monotonic() < deadline:
                time.sleep(0.01)
                go_on, seen = self._enough(began)
            self.saw.append(seen)
            return target(*args, **kwargs)

        return slow


class TestTheLoopRunsOnDuringAWrite:
    @pytest.mark.asyncio
    @pytest.mark.timeout(120)
    async def test_a_batch_launches_tasks_while_a_result_write_waits(self, tmp_path: Path):
        """64 tasks, a store write per result: new tasks start while the first write waits."""
        starts = tmp_path / "starts"
        starts.touch()
        width = 4
        site = load_site(ROOT / "site-configs" / "local.toml").model_copy(
            update={"max_concurrency": width}
        )

        def started() -> int:
            return len(starts.read_bytes())

        def enough(began: int | None) -> Any:
            if began is None:
                return started()
            # More tasks than could have been in flight when the write began: launched since.
            during = started() - began
            return (during > width, during)

        store = ProvenanceStore.open(tmp_path / "db")
        store.ensure_campaign("c", spec={}, site="local", seed=1, code_version="t")
        slow = SlowWrites(store, "record_event", enough)
        script = f"printf x >> {starts}; sleep 0.05; echo 1"
        tasks = [ExecutableTask(argv=["sh", "-c", script]) for _ in range(64)]
        try:
            async with (
                StoreThread(slow) as writes,  # type: ignore[type-var]  # forwards to a store
                AllocationExecutor.from_site(site, work_dir=str(tmp_path)) as executor,
            ):
                first = True

                def on_result(result: Any) -> None:
                    nonlocal first
                    if first:  # the first result's write waits; the others go through
                        first = False
                        writes.later(slow.record_event, "c", "task_result", details={})

                results = await executor.run_batch(tasks, key_prefix="c/0/b", on_result=on_result)
        finally:
            store.close()
        assert [r.status for r in results] == ["done"] * 64
        assert started() == 64
        # Tasks were launched while the write was in progress: more than were in flight.
        assert slow.saw[0] > width, slow.saw

    @pytest.mark.asyncio
    @pytest.mark.timeout(180)
    async def test_the_engine_awaits_its_checkpoint_while_the_loop_runs_on(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ):
        """The demo campaign through ``run_direct``: a coroutine beside it ticks during a write."""
        import flows._engine._direct as direct

        shutil.copytree(DEMO, tmp_path / "demo")
        ticks = 0

        def enough(began: int | None) -> Any:
            if began is None:
                return ticks
            return (ticks - began >= 3, ticks - began)

        opened: list[SlowWrites] = []
        open_store = direct.open_store

        def slow_store(*args: Any) -> Any:
            opened.append(SlowWrites(open_store(*args), "checkpoint_round", enough))
            return opened[-1]

        monkeypatch.setattr(direct, "open_store", slow_store)
        done = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        async def campaign() -> Any:
            try:
                return await direct.run_direct(
                    tmp_path / "demo" / "campaign.toml", state_dir=tmp_path / "home", env={}
                )
            finally:
                done.set()

        result, _ = await asyncio.gather(campaign(), ticker())
        assert result.status == "completed"
        # Each round's checkpoint waited until the coroutine beside it had ticked meanwhile.
        assert len(opened[0].saw) == 4
        assert min(opened[0].saw) >= 3, opened[0].saw


def _hanging_receiver() -> tuple[ThreadingHTTPServer, threading.Event, list[dict[str, Any]]]:
    release = threading.Event()
    received: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length))
            release.wait(PATIENCE_SECONDS)
            received.append(body)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, release, received


class TestNoticesFromAQueue:
    @pytest.mark.asyncio
    @pytest.mark.timeout(60)
    async def test_a_slow_channel_never_holds_up_the_event_hook(self, tmp_path: Path):
        server, release, received = _hanging_receiver()
        url = f"http://127.0.0.1:{server.server_address[1]}/hook"
        config = NotifyConfig(webhook_url=url, timeout_seconds=PATIENCE_SECONDS + 10)
        journal = tmp_path / "n.jsonl"
        sender = NoticeSender(Notifier(config, "c", journal))
        try:
            sender.on_event("failed", {"round": 1, "code": "internal"})
            # The hook returned while the receiver still holds the delivery.
            assert not release.is_set()
            assert received == []
            assert not journal.exists()
            release.set()
            assert await sender.aclose()
        finally:
            release.set()
            server.shutdown()
            server.server_close()
        lines = [json.loads(line) for line in journal.read_text().splitlines()]
        assert [(e["kind"], e["status"]) for e in lines] == [("failed", "sent")]
        assert [p["text"] for p in received] == [
            "[unattended] campaign c failed in round 1 (internal)"
        ]

    @pytest.mark.asyncio
    async def test_notices_go_in_the_order_queued_each_once(self, webhook: Any, tmp_path: Path):
        journal = tmp_path / "n.jsonl"
        config = NotifyConfig(webhook_url=webhook.url, events=["failed", "blocked", "recovered"])
        sender = NoticeSender(Notifier(config, "c", journal))
        sender.on_event("recovered", {"round": 1})
        sender.on_event("stopped", {"round": 1, "status": "blocked", "code": "policy_denied"})
        sender.on_event("stopped", {"round": 1, "status": "blocked", "code": "policy_denied"})
        sender.on_event("task", {"round": 1, "status": "done"})  # not a notice
        assert await sender.aclose()
        assert [p["text"].split(" ", 3)[3] for p in webhook.posts] == [
            "recovered: it continues from round 1 after a restart; nothing done before is repeated",
            "was blocked in round 1 (policy_denied)",
        ]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q", "-n", "0"]))
