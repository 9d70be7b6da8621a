"""Outcomes: the severity order, merging ties, and the run status each leads to."""

from __future__ import annotations

import itertools

import pytest

from policies import Block, Continue, Escalate, Retry, Suspend, combine, run_status

ORDERED = [
    Block("stop", "policy_denied"),
    Suspend("ask", ("alice",)),
    Escalate("hand off", ("ops",)),
    Retry("again"),
    Continue(modified=[[1.0]]),
    Continue(),
]


class TestCombine:
    def test_no_outcomes_continue(self) -> None:
        assert combine() == Continue()

    @pytest.mark.parametrize(("stronger", "weaker"), list(itertools.combinations(ORDERED, 2)))
    def test_most_severe_wins_in_either_order(self, stronger: object, weaker: object) -> None:
        assert combine(stronger, weaker) == stronger  # type: ignore[arg-type]
        assert combine(weaker, stronger) == stronger  # type: ignore[arg-type]

    def test_tied_retries_keep_every_reason(self) -> None:
        assert combine(Retry("a"), Continue(), Retry("b")) == Retry("a; b")

    def test_tied_reasons_drop_duplicates(self) -> None:
        assert combine(Retry("a"), Retry("a")) == Retry("a")

    def test_tied_suspends_unite_approvers(self) -> None:
        merged = combine(Suspend("x", ("alice", "bob")), Suspend("y", ("bob", "carol")))
        assert merged == Suspend("x; y", ("alice", "bob", "carol"))

    def test_tied_escalations_unite_targets(self) -> None:
        merged = combine(Escalate("x", ("ops",)), Escalate("y", ("pi", "ops")))
        assert merged == Escalate("x; y", ("ops", "pi"))

    def test_tied_blocks_keep_first_code_and_all_reasons(self) -> None:
        merged = combine(Block("x", "budget_exceeded"), Block("y", "policy_denied"))
        assert merged == Block("x; y", "budget_exceeded")

    def test_first_modification_wins_between_two(self) -> None:
        assert combine(Continue(modified=1), Continue(modified=2)) == Continue(modified=1)


class TestRunStatus:
    @pytest.mark.parametrize(
        ("outcome", "status"),
        [
            (Block("r"), "blocked"),
            (Suspend("r", ("a",)), "awaiting_approval"),
            (Escalate("r", ("a",)), "escalated"),
            (Retry("r"), None),
            (Continue(modified=1), None),
            (Continue(), None),
        ],
    )
    def test_status_of_each_outcome(self, outcome: object, status: str | None) -> None:
        assert run_status(outcome) == status  # type: ignore[arg-type]
        assert outcome.run_status == status  # type: ignore[attr-defined]

    def test_block_defaults_to_policy_denied(self) -> None:
        assert Block("r").code == "policy_denied"

    def test_outcomes_are_frozen(self) -> None:
        with pytest.raises(AttributeError):
            Retry("r").reason = "other"  # type: ignore[misc]
