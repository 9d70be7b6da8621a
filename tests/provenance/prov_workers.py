"""Worker processes for the concurrency tests (importable by spawned children)."""

from __future__ import annotations

from typing import Any

SHARED_ATTEMPTS = 10
OWN_ATTEMPTS = 15


def write_campaign_events(url: str, worker: int, barrier: Any) -> None:
    """Open the store at ``url`` and record one worker's share of a campaign.

    Every worker also records the same attempts of one shared gate call, so
    idempotent inserts race each other.
    """
    from acceptance import Attempt, Verdict
    from flows._provenance import ProvenanceStore

    barrier.wait(timeout=60)  # all workers open (and migrate) the fresh database at once
    store = ProvenanceStore.open(url)
    try:
        store.ensure_campaign("race", spec={"n": 8}, site="local", seed=1, code_version="t")
        shared = store.record_gate_call(
            "race", 0, 0, gate="g", budget=99, fallback_hash="h", fallback_value=[0.0]
        )
        own = store.record_gate_call(
            "race",
            1,
            worker,
            gate="g",
            budget=99,
            fallback_hash="h",
            fallback_value=[float(worker)],
        )
        verdicts = (Verdict("schema", True, None, 0.001), Verdict("bounds", False, "no", 0.002))
        for number in range(1, max(SHARED_ATTEMPTS, OWN_ATTEMPTS) + 1):
            attempt = Attempt(
                number=number,
                value={"w": worker, "n": number},
                rejected_by="bounds",
                reason="no",
                verdicts=verdicts,
                duration=0.003,
            )
            if number <= SHARED_ATTEMPTS:
                store.record_attempt(shared, attempt)
            if number <= OWN_ATTEMPTS:
                store.record_attempt(own, attempt)
        store.record_decision("race", 1, worker, {"outcome": "continue"})
        key = f"race-{worker}"
        store.record_batch_launched(
            key,
            campaign="race",
            round_index=1,
            candidates=[[worker], [worker + 0.5]],
            backend="local",
        )
        store.record_batch_results(
            key,
            [
                {
                    "index": i,
                    "key": f"{key}-{i}",
                    "status": "done",
                    "value": worker + i,
                    "runtime": 0.0,
                    "host": "h",
                    "exit_code": 0,
                    "stderr_tail": "",
                    "attempts": 1,
                    "error_code": None,
                    "retries": [],
                }
                for i in range(2)
            ],
        )
    finally:
        store.close()
