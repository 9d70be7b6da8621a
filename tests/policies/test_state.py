"""A policy's state round-trips, so a killed campaign continues with the same counts."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import BatchSummary, Policy, RoundContext, Rule, Severity, SpecInvalid, proposal_key

MakeContext = Callable[..., RoundContext]

RULES = (
    Rule(name="stop", when="batch.node_hours > 9.0", severity=Severity.HARD_STOP),
    Rule(name="never", when="batch.size > 3", severity=Severity.PERSISTENT_BLOCK),
    Rule(name="ask", when="batch.node_hours > 6.0", severity=Severity.ASK, approvers=("alice",)),
    Rule(name="soft", when="batch.node_hours > 2.0", severity=Severity.SOFT_BLOCK),
    Rule(name="soft-py", when=lambda c: c.round_index % 3 == 1, severity=Severity.SOFT_BLOCK),
    Rule(name="warn", when="batch.node_hours > 1.0", severity=Severity.BLOCK_AND_WARN),
    Rule(name="tol", when="budget.remaining < 50.0", severity=Severity.TOLERATE),
    Rule(name="shadow", when="round.attempt > 1", severity=Severity.ASK, log_only=True),
)

step = st.fixed_dictionaries(
    {
        "hours": st.sampled_from([0.5, 1.5, 3.0, 7.0, 10.0]),
        "rows": st.sampled_from([[[0.1]], [[0.2]], [[0.1], [0.2], [0.3], [0.4]]]),
        "new_round": st.booleans(),
        "can_suspend": st.booleans(),
        "resume": st.booleans(),
    }
)
policy_settings = st.fixed_dictionaries(
    {
        "max_soft_attempts": st.integers(1, 4),
        "soft_block_mode": st.sampled_from(["cumulative", "consecutive", "hybrid"]),
        "max_consecutive_soft_attempts": st.none() | st.integers(1, 3),
        "escalate_to": st.sampled_from(["HARD_STOP", "ASK"]),
        "latch_stop": st.booleans(),
    }
)


def contexts(steps: list[dict[str, Any]]) -> list[tuple[RoundContext, bool]]:
    """Turn drawn steps into a campaign's sequence of gate calls."""
    out = []
    round_index, attempt = 0, 0
    for s in steps:
        if s["new_round"]:
            round_index, attempt = round_index + 1, 1
        else:
            attempt += 1
        rows = s["rows"]
        ctx = RoundContext(
            campaign="prop",
            round_index=round_index,
            attempt=max(attempt, 1),
            batch=BatchSummary(size=len(rows), candidates=rows, node_hours=s["hours"]),
            proposal_key=proposal_key(rows),
            disposition="accepted",
            consecutive_fallbacks=0,
            budget_spent=float(round_index),
            budget_remaining=100.0 - 10.0 * round_index,
            can_suspend=s["can_suspend"],
        )
        out.append((ctx, s["resume"]))
    return out


def drive(policy: Policy, calls: list[tuple[RoundContext, bool]]) -> list[Any]:
    decisions = []
    for ctx, resume in calls:
        if resume:
            policy.resume()
        decisions.append(policy.decide_and_count(ctx))
    return decisions


class TestStateRoundTrip:
    @settings(max_examples=150, deadline=None, derandomize=True, database=None)
    @given(
        steps=st.lists(step, min_size=1, max_size=14),
        cut=st.integers(0, 14),
        config=policy_settings,
    )
    def test_restored_policy_decides_identically(
        self, steps: list[dict[str, Any]], cut: int, config: dict[str, Any]
    ) -> None:
        calls = contexts(steps)
        cut = min(cut, len(calls))
        straight = drive(Policy(RULES, **config), calls)
        first = Policy(RULES, **config)
        before = drive(first, calls[:cut])
        saved = json.loads(json.dumps(first.to_state()))
        second = Policy(RULES, **config)
        second.load_state(saved)
        after = drive(second, calls[cut:])
        assert before + after == straight

    def test_state_holds_counters_pointer_and_latch(self, make_ctx: MakeContext) -> None:
        policy = Policy(RULES, latch_stop=True)
        policy.decide_and_count(make_ctx(node_hours=1.5))
        policy.decide_and_count(make_ctx(node_hours=3.0, round_index=1))
        policy.decide_and_count(make_ctx(node_hours=10.0, round_index=2))
        state = policy.to_state()
        assert state["soft_counts"] == {"soft": 2, "soft-py": 1}
        assert state["warned"]["warn"]["round_index"] == 2
        assert state["latched"] == "stop"

    def test_with_state_gives_a_continuing_copy(self, make_ctx: MakeContext) -> None:
        policy = Policy(RULES, max_soft_attempts=2)
        policy.decide_and_count(make_ctx(node_hours=3.0))
        copy = policy.with_state(policy.to_state())
        assert copy is not policy
        decision = copy.decide_and_count(make_ctx(node_hours=3.0, round_index=1))
        assert decision.escalated

    def test_with_state_leaves_the_policy_it_copies_as_it_was(self, make_ctx: MakeContext) -> None:
        policy = Policy(RULES, max_soft_attempts=2)
        before = policy.to_state()
        policy.with_state({"soft_counts": {"soft": 1}})
        assert policy.to_state() == before


class TestEarlierNames:
    """``evaluate`` and ``from_state`` (documented before the rename) still work, and warn."""

    def test_evaluate_warns_and_counts_as_decide_and_count_does(
        self, make_ctx: MakeContext
    ) -> None:
        old, new = Policy(RULES), Policy(RULES)
        with pytest.warns(DeprecationWarning, match="decide_and_count"):
            decision = old.evaluate(make_ctx(node_hours=3.0))
        assert decision == new.decide_and_count(make_ctx(node_hours=3.0))
        assert old.to_state() == new.to_state()

    def test_from_state_warns_and_copies_as_with_state_does(self, make_ctx: MakeContext) -> None:
        policy = Policy(RULES)
        policy.decide_and_count(make_ctx(node_hours=3.0))
        with pytest.warns(DeprecationWarning, match="with_state"):
            copy = policy.from_state(policy.to_state())
        assert copy is not policy
        assert copy.to_state() == policy.to_state()

    def test_unknown_keys_are_ignored(self, make_ctx: MakeContext) -> None:
        policy = Policy(RULES)
        policy.load_state({"soft_counts": {"soft": 2}, "trace": [1, 2], "future": {"x": 1}})
        assert policy.to_state()["soft_counts"] == {"soft": 2}

    def test_counters_of_removed_rules_are_dropped(self) -> None:
        policy = Policy(RULES)
        policy.load_state({"soft_counts": {"gone": 5, "soft": 1}})
        assert policy.to_state()["soft_counts"] == {"soft": 1}

    def test_wrongly_typed_state_names_the_key(self) -> None:
        policy = Policy(RULES)
        with pytest.raises(SpecInvalid) as caught:
            policy.load_state({"soft_counts": {"soft": "many"}})
        assert caught.value.details["field"] == "state.soft_counts.soft"

    def test_reset_forgets_counts(self, make_ctx: MakeContext) -> None:
        policy = Policy(RULES)
        policy.decide_and_count(make_ctx(node_hours=3.0))
        policy.reset()
        assert policy.to_state()["soft_counts"] == {}
