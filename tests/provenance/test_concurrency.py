"""Eight processes write one campaign at once: nothing lost, nothing doubled, no lock errors."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from flows._provenance import ProvenanceStore

WORKERS = 8


def _run_workers(url: str, monkeypatch: pytest.MonkeyPatch) -> list[int | None]:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # children import prov_workers
    import prov_workers

    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(WORKERS)
    processes = [
        context.Process(target=prov_workers.write_campaign_events, args=(url, n, barrier))
        for n in range(WORKERS)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=100)
    codes = [p.exitcode for p in processes]
    for process in processes:
        if process.is_alive():
            process.kill()
    return codes


def _assert_complete(url: str) -> None:
    import prov_workers

    with ProvenanceStore.open(url, read_only=url.startswith("/")) as store:
        shared = store.gate_calls("race", 0)
        own = store.gate_calls("race", 1)
        assert len(shared) == 1
        assert [c["call_index"] for c in own] == list(range(WORKERS))
        assert len(store.attempts(shared[0]["id"])) == prov_workers.SHARED_ATTEMPTS
        assert [len(store.attempts(c["id"])) for c in own] == [prov_workers.OWN_ATTEMPTS] * WORKERS
        assert [d["seq"] for d in store.decisions("race", 1)] == list(range(WORKERS))
        for worker in range(WORKERS):
            results = store.find_batch(f"race-{worker}")
            assert results is not None
            assert [r.value for r in results] == [worker, worker + 1]


class TestConcurrentWriters:
    def test_eight_processes_on_one_sqlite_file(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        url = str(tmp_path / "race.db")
        assert _run_workers(url, monkeypatch) == [0] * WORKERS
        _assert_complete(url)

    @pytest.mark.integration
    def test_eight_processes_on_postgresql(
        self, pg_template: str, pg_admin: dict[str, Any], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        name = pg_admin["create"]()  # empty: the workers race to migrate it too
        url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
        try:
            assert _run_workers(url, monkeypatch) == [0] * WORKERS
            _assert_complete(url)
        finally:
            pg_admin["drop"](name)
