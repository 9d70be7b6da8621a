"""The campaign lease: one live run per campaign, checked inside every write."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from flows._provenance import CampaignFenced, ProvenanceStore


@pytest.fixture
def store(tmp_path: Path) -> ProvenanceStore:
    opened = ProvenanceStore.open(tmp_path)
    opened.ensure_campaign("c", spec={}, site="s", seed=1, code_version="v")
    return opened


def _second(tmp_path: Path) -> ProvenanceStore:
    return ProvenanceStore.open(tmp_path)


class TestLease:
    def test_a_live_holder_keeps_the_lease(self, store: ProvenanceStore, tmp_path: Path) -> None:
        assert store.acquire_lease("c", "run-1", ttl=60).acquired
        taken = _second(tmp_path).acquire_lease("c", "run-2", ttl=60)
        assert not taken.acquired
        assert taken.holder is not None
        assert taken.holder.owner == "run-1"

    def test_the_same_owner_takes_it_back_at_once(
        self, store: ProvenanceStore, tmp_path: Path
    ) -> None:
        store.acquire_lease("c", "run-1", ttl=60)
        assert _second(tmp_path).acquire_lease("c", "run-1", ttl=60).acquired

    def test_an_expired_lease_is_taken(self, store: ProvenanceStore, tmp_path: Path) -> None:
        store.acquire_lease("c", "run-1", ttl=0)
        assert _second(tmp_path).acquire_lease("c", "run-2", ttl=60).acquired

    def test_a_lease_whose_process_is_gone_is_taken(self, tmp_path: Path) -> None:
        code = (
            "from flows._provenance import ProvenanceStore\n"
            f"s = ProvenanceStore.open({str(tmp_path)!r})\n"
            "s.ensure_campaign('c', spec={}, site='s', seed=1, code_version='v')\n"
            "assert s.acquire_lease('c', 'run-1', ttl=3600).acquired\n"
        )
        subprocess.run([sys.executable, "-c", code], check=True)
        assert _second(tmp_path).acquire_lease("c", "run-2", ttl=60).acquired

    def test_a_lease_whose_process_is_a_zombie_is_taken(self, tmp_path: Path) -> None:
        """Killed with its parent, a holder waits as a zombie until init reaps it (2 s here)."""
        code = (
            "from flows._provenance import ProvenanceStore\n"
            f"s = ProvenanceStore.open({str(tmp_path)!r})\n"
            "s.ensure_campaign('c', spec={}, site='s', seed=1, code_version='v')\n"
            "assert s.acquire_lease('c', 'run-1', ttl=3600).acquired\n"
        )
        holder = subprocess.Popen([sys.executable, "-c", code])  # not reaped: a zombie at exit
        try:
            process = psutil.Process(holder.pid)
            deadline = time.monotonic() + 60
            while process.status() != psutil.STATUS_ZOMBIE:
                assert time.monotonic() < deadline, "the holder did not exit"
                time.sleep(0.05)
            taken = _second(tmp_path).acquire_lease("c", "run-2", ttl=60)
            assert taken.acquired, taken.holder
        finally:
            assert holder.wait() == 0

    def test_a_run_that_lost_the_lease_records_nothing(
        self, store: ProvenanceStore, tmp_path: Path
    ) -> None:
        store.acquire_lease("c", "run-1", ttl=0)
        other = _second(tmp_path)
        other.acquire_lease("c", "run-2", ttl=60)
        with pytest.raises(CampaignFenced, match="no longer holds its lease"):
            store.start_round("c", 0)
        with pytest.raises(CampaignFenced):
            store.set_campaign_status("c", "failed", "internal")
        assert other.load_checkpoint("c").last_completed_round is None
        assert [c["status"] for c in other.campaigns()] == ["running"]
        assert not store.renew_lease("c", ttl=60)

    def test_a_released_lease_is_free_and_its_holder_writes_unfenced(
        self, store: ProvenanceStore, tmp_path: Path
    ) -> None:
        store.acquire_lease("c", "run-1", ttl=60)
        store.release_lease("c")
        assert _second(tmp_path).acquire_lease("c", "run-2", ttl=60).acquired
