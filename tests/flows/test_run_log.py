"""The run log says the engine's events in words, the gate with the policy's decision on it."""

from __future__ import annotations

from flows._prefect._campaign import RunLog


def lines(*events: tuple[str, dict[str, object]]) -> list[str]:
    log = RunLog()
    said = (log.line(kind, data) for kind, data in events)
    return [line for line in said if line is not None]


def test_a_round_is_three_lines_and_no_simulation_is_one():
    assert lines(
        ("round", {"round": 3, "of": 10}),
        ("gate", {"round": 3, "disposition": "accepted", "attempts": 1}),
        ("decision", {"round": 3, "outcome": "continue"}),
        ("task", {"round": 3, "status": "done"}),
        ("task", {"round": 3, "status": "failed"}),
        ("batch", {"round": 3, "done": 1, "failed": 1}),
    ) == [
        "round 3 of 10: started",
        "round 3: gate accepted after 1 attempt; policy continue",
        "round 3: batch finished, 1 done, 1 failed",
    ]


def test_each_gate_call_is_said_with_its_own_decision():
    assert lines(
        ("gate", {"round": 0, "disposition": "fallback", "attempts": 3}),
        ("decision", {"round": 0, "outcome": "retry"}),
        ("decision", {"round": 0, "outcome": "suspend"}),
        (
            "suspend",
            {
                "round": 0,
                "key": "c/0/1",
                "rule": "big",
                "approvers": ["alice", "bob"],
                "deadline": "2026-12-05T10:00:00+00:00",
            },
        ),
        ("approval", {"round": 0, "verdict": "approved", "by": "alice"}),
    ) == [
        "round 0: gate fallback after 3 attempts; policy retry",
        "round 0: policy suspend",
        "round 0: waiting for approval c/0/1 (rule big; approvers alice, bob; "
        "until 2026-12-05T10:00:00+00:00)",
        "round 0: approval approved by alice",
    ]


def test_other_events_name_their_details():
    assert lines(
        ("failed", {"round": 2, "code": "budget_exceeded"}),
        ("completed", {"rounds": 4}),
        ("recovered", {}),
    ) == ["failed: round 2, code budget_exceeded", "completed: rounds 4", "recovered"]
