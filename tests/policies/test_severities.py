"""What each severity does when its rule fires, and how fired rules combine."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from policies import (
    Block,
    Continue,
    Escalate,
    Policy,
    Retry,
    RoundContext,
    Rule,
    Severity,
    Suspend,
)

MakeContext = Callable[..., RoundContext]

BIG = "batch.node_hours > 4.0"


def rule(name: str = "big", severity: Severity = Severity.HARD_STOP, **kw: Any) -> Rule:
    kw.setdefault("when", BIG)
    return Rule(name=name, severity=severity, **kw)


class TestHardStop:
    def test_fired_rule_blocks_with_policy_denied(self, make_ctx: MakeContext) -> None:
        decision = Policy([rule()]).decide_and_count(make_ctx(node_hours=5.0))
        assert decision.outcome == Block(decision.outcome.reason, "policy_denied")
        assert decision.outcome.run_status == "blocked"

    def test_quiet_rule_continues(self, make_ctx: MakeContext) -> None:
        decision = Policy([rule()]).decide_and_count(make_ctx(node_hours=1.0))
        assert decision.outcome == Continue()
        assert decision.fired == ()

    def test_without_latch_next_round_is_judged_afresh(self, make_ctx: MakeContext) -> None:
        policy = Policy([rule()])
        policy.decide_and_count(make_ctx(node_hours=5.0))
        assert (
            policy.decide_and_count(make_ctx(node_hours=1.0, round_index=1)).outcome == Continue()
        )

    def test_latch_refuses_every_later_round(self, make_ctx: MakeContext) -> None:
        policy = Policy([rule()], latch_stop=True)
        policy.decide_and_count(make_ctx(node_hours=5.0))
        later = policy.decide_and_count(make_ctx(node_hours=1.0, round_index=1))
        assert isinstance(later.outcome, Block)
        assert later.latched
        assert policy.latched == "big"
        assert "big" in later.outcome.reason

    def test_resume_lifts_the_latch(self, make_ctx: MakeContext) -> None:
        policy = Policy([rule()], latch_stop=True)
        policy.decide_and_count(make_ctx(node_hours=5.0))
        policy.resume()
        decision = policy.decide_and_count(make_ctx(node_hours=1.0, round_index=1))
        assert decision.outcome == Continue()
        assert not decision.latched


class TestPersistentBlock:
    def test_refuses_the_proposal(self, make_ctx: MakeContext) -> None:
        decision = Policy([rule(severity=Severity.PERSISTENT_BLOCK)]).decide_and_count(
            make_ctx(node_hours=5.0)
        )
        assert isinstance(decision.outcome, Retry)
        assert decision.attempts == 1

    def test_repeating_the_proposal_never_overrides(self, make_ctx: MakeContext) -> None:
        policy = Policy([rule(severity=Severity.PERSISTENT_BLOCK)])
        policy.decide_and_count(make_ctx(node_hours=5.0, attempt=1))
        again = policy.decide_and_count(make_ctx(node_hours=5.0, attempt=2))
        assert isinstance(again.outcome, Retry)
        assert again.override is None
        assert again.attempts == 2


class TestAsk:
    def test_suspends_for_the_approvers(self, make_ctx: MakeContext) -> None:
        policy = Policy([rule(severity=Severity.ASK, approvers=("alice", "bob"))])
        decision = policy.decide_and_count(make_ctx(node_hours=5.0))
        assert isinstance(decision.outcome, Suspend)
        assert decision.outcome.approvers == ("alice", "bob")
        assert decision.outcome.run_status == "awaiting_approval"

    def test_without_approvers_acts_as_persistent_block(self, make_ctx: MakeContext) -> None:
        decision = Policy([rule(severity=Severity.ASK)]).decide_and_count(make_ctx(node_hours=5.0))
        assert isinstance(decision.outcome, Retry)

    def test_without_approvers_of_its_own_the_campaign_s_approvers_answer(
        self, make_ctx: MakeContext
    ) -> None:
        policy = Policy([rule(severity=Severity.ASK, require_proof=True)])
        decision = policy.decide_and_count(make_ctx(node_hours=5.0, default_approvers=("carol",)))
        assert decision.outcome == Suspend(decision.outcome.reason, ("carol",), True)

    def test_the_rule_s_own_approvers_come_before_the_campaign_s(
        self, make_ctx: MakeContext
    ) -> None:
        policy = Policy([rule(severity=Severity.ASK, approvers=("alice",))])
        decision = policy.decide_and_count(make_ctx(node_hours=5.0, default_approvers=("carol",)))
        assert isinstance(decision.outcome, Suspend)
        assert decision.outcome.approvers == ("alice",)

    def test_escalates_when_the_run_cannot_suspend(self, make_ctx: MakeContext) -> None:
        policy = Policy([rule(severity=Severity.ASK, approvers=("alice",))])
        decision = policy.decide_and_count(make_ctx(node_hours=5.0, can_suspend=False))
        assert decision.outcome == Escalate(decision.outcome.reason, ("alice",))
        assert decision.outcome.run_status == "escalated"


def soft_policy(**settings: Any) -> Policy:
    return Policy([rule("soft", Severity.SOFT_BLOCK, approvers=("alice",))], **settings)


def run(policy: Policy, make_ctx: MakeContext, hours: list[float]) -> list[Any]:
    """Evaluate one context per entry (a new gate call each) and return the decisions."""
    return [
        policy.decide_and_count(make_ctx(node_hours=h, round_index=i, attempt=1))
        for i, h in enumerate(hours)
    ]


def kinds(decisions: list[Any]) -> list[str]:
    return [d.outcome.kind for d in decisions]


class TestSoftBlock:
    def test_retries_until_the_limit_then_escalates(self, make_ctx: MakeContext) -> None:
        decisions = run(soft_policy(), make_ctx, [5.0, 5.0, 5.0])
        assert kinds(decisions) == ["retry", "retry", "block"]
        assert [d.escalated for d in decisions] == [False, False, True]

    def test_feedback_counts_attempts(self, make_ctx: MakeContext) -> None:
        decisions = run(soft_policy(), make_ctx, [5.0, 5.0])
        assert "Attempt 1 of 3" in decisions[0].feedback
        assert "Attempt 2 of 3" in decisions[1].feedback
        assert decisions[1].attempts == 2

    def test_cumulative_count_survives_quiet_rounds(self, make_ctx: MakeContext) -> None:
        decisions = run(soft_policy(), make_ctx, [5.0, 1.0, 5.0, 1.0, 5.0])
        assert kinds(decisions) == ["retry", "continue", "retry", "continue", "block"]

    def test_consecutive_count_resets_on_a_quiet_round(self, make_ctx: MakeContext) -> None:
        policy = soft_policy(soft_block_mode="consecutive")
        decisions = run(policy, make_ctx, [5.0, 5.0, 1.0, 5.0, 5.0, 5.0])
        assert kinds(decisions) == ["retry", "retry", "continue", "retry", "retry", "block"]

    def test_consecutive_threshold_of_its_own(self, make_ctx: MakeContext) -> None:
        policy = soft_policy(soft_block_mode="consecutive", max_consecutive_soft_attempts=2)
        assert kinds(run(policy, make_ctx, [5.0, 5.0])) == ["retry", "block"]

    def test_hybrid_escalates_on_a_streak(self, make_ctx: MakeContext) -> None:
        policy = soft_policy(
            soft_block_mode="hybrid", max_soft_attempts=5, max_consecutive_soft_attempts=2
        )
        assert kinds(run(policy, make_ctx, [5.0, 5.0])) == ["retry", "block"]

    def test_hybrid_escalates_on_the_total(self, make_ctx: MakeContext) -> None:
        policy = soft_policy(
            soft_block_mode="hybrid", max_soft_attempts=3, max_consecutive_soft_attempts=2
        )
        decisions = run(policy, make_ctx, [5.0, 1.0, 5.0, 1.0, 5.0])
        assert kinds(decisions) == ["retry", "continue", "retry", "continue", "block"]

    def test_escalation_to_ask_suspends_and_restarts_count(self, make_ctx: MakeContext) -> None:
        policy = soft_policy(max_soft_attempts=2, escalate_to="ASK")
        decisions = run(policy, make_ctx, [5.0, 5.0, 5.0, 5.0])
        assert kinds(decisions) == ["retry", "suspend", "retry", "suspend"]
        assert decisions[1].outcome == Suspend(decisions[1].outcome.reason, ("alice",))
        assert decisions[1].escalated

    def test_escalation_to_hard_stop_latches(self, make_ctx: MakeContext) -> None:
        policy = soft_policy(max_soft_attempts=1, latch_stop=True)
        decisions = run(policy, make_ctx, [5.0, 1.0])
        assert kinds(decisions) == ["block", "block"]
        assert decisions[1].latched


def warn_policy() -> Policy:
    return Policy([rule("warn", Severity.BLOCK_AND_WARN)])


class TestBlockAndWarn:
    def test_first_time_refuses(self, make_ctx: MakeContext) -> None:
        decision = warn_policy().decide_and_count(make_ctx(node_hours=5.0))
        assert isinstance(decision.outcome, Retry)
        assert decision.override is None

    def test_identical_proposal_in_later_attempt_passes(self, make_ctx: MakeContext) -> None:
        policy = warn_policy()
        policy.decide_and_count(make_ctx(node_hours=5.0, attempt=1))
        decision = policy.decide_and_count(make_ctx(node_hours=5.0, attempt=2))
        assert decision.outcome == Continue()
        assert decision.override == "warn"
        assert decision.fired[0].effect == "override"

    def test_identical_proposal_in_later_round_passes(self, make_ctx: MakeContext) -> None:
        policy = warn_policy()
        policy.decide_and_count(make_ctx(node_hours=5.0, round_index=1))
        decision = policy.decide_and_count(make_ctx(node_hours=5.0, round_index=2))
        assert decision.override == "warn"

    def test_same_gate_call_again_is_not_insisting(self, make_ctx: MakeContext) -> None:
        policy = warn_policy()
        policy.decide_and_count(make_ctx(node_hours=5.0))
        assert isinstance(policy.decide_and_count(make_ctx(node_hours=5.0)).outcome, Retry)

    def test_different_proposal_is_warned_and_moves_pointer(self, make_ctx: MakeContext) -> None:
        policy = warn_policy()
        policy.decide_and_count(make_ctx(node_hours=5.0, attempt=1, candidates=[[1.0]]))
        other = policy.decide_and_count(make_ctx(node_hours=5.0, attempt=2, candidates=[[2.0]]))
        repeat = policy.decide_and_count(make_ctx(node_hours=5.0, attempt=3, candidates=[[2.0]]))
        assert isinstance(other.outcome, Retry)
        assert repeat.override == "warn"

    def test_override_is_used_up(self, make_ctx: MakeContext) -> None:
        policy = warn_policy()
        for attempt in (1, 2):
            policy.decide_and_count(make_ctx(node_hours=5.0, attempt=attempt))
        assert isinstance(
            policy.decide_and_count(make_ctx(node_hours=5.0, attempt=3)).outcome, Retry
        )


class TestTolerate:
    def test_continues_and_notes_the_violation(self, make_ctx: MakeContext) -> None:
        decision = Policy([rule("tol", Severity.TOLERATE)]).decide_and_count(
            make_ctx(node_hours=5.0)
        )
        assert decision.outcome == Continue()
        assert len(decision.notes) == 1
        assert "tol" in decision.notes[0]


class TestShadowMode:
    def test_log_only_rule_never_acts(self, make_ctx: MakeContext) -> None:
        policy = Policy([rule(log_only=True)], latch_stop=True)
        decision = policy.decide_and_count(make_ctx(node_hours=5.0))
        assert decision.outcome == Continue()
        assert policy.latched is None
        assert decision.shadow
        assert "would block" in decision.shadow[0]

    def test_policy_wide_log_only(self, make_ctx: MakeContext) -> None:
        policy = Policy([rule(), rule("ask", Severity.ASK, approvers=("a",))], log_only=True)
        decision = policy.decide_and_count(make_ctx(node_hours=5.0))
        assert decision.outcome == Continue()
        assert len(decision.shadow) == 2

    def test_log_only_soft_block_does_not_count(self, make_ctx: MakeContext) -> None:
        policy = Policy([rule("soft", Severity.SOFT_BLOCK, log_only=True)])
        run(policy, make_ctx, [5.0, 5.0, 5.0, 5.0])
        assert policy.to_state()["soft_counts"] == {}


class TestDeciding:
    def test_strongest_severity_decides_and_comes_first(self, make_ctx: MakeContext) -> None:
        policy = Policy(
            [rule("warn", Severity.BLOCK_AND_WARN), rule("ask", Severity.ASK, approvers=("a",))]
        )
        decision = policy.decide_and_count(make_ctx(node_hours=5.0))
        assert isinstance(decision.outcome, Suspend)
        assert [f.rule for f in decision.fired] == ["ask", "warn"]

    def test_persistent_block_outranks_ask(self, make_ctx: MakeContext) -> None:
        policy = Policy(
            [rule("ask", Severity.ASK, approvers=("a",)), rule("never", Severity.PERSISTENT_BLOCK)]
        )
        decision = policy.decide_and_count(make_ctx(node_hours=5.0))
        assert isinstance(decision.outcome, Retry)
        assert decision.fired[0].rule == "never"

    def test_equal_severities_merge(self, make_ctx: MakeContext) -> None:
        policy = Policy(
            [
                rule("one", Severity.ASK, approvers=("alice",)),
                rule("two", Severity.ASK, approvers=("bob",)),
            ]
        )
        decision = policy.decide_and_count(make_ctx(node_hours=5.0))
        assert isinstance(decision.outcome, Suspend)
        assert decision.outcome.approvers == ("alice", "bob")
        assert "one" in decision.outcome.reason
        assert "two" in decision.outcome.reason

    def test_feedback_names_rule_detail_and_advice(self, make_ctx: MakeContext) -> None:
        policy = Policy([rule(severity=Severity.PERSISTENT_BLOCK, advice="Propose fewer.")])
        feedback = policy.decide_and_count(make_ctx(node_hours=5.5)).feedback
        assert "'big'" in feedback
        assert "batch.node_hours=5.5" in feedback
        assert "Propose fewer" in feedback

    def test_record_is_json_ready(self, make_ctx: MakeContext) -> None:
        policy = Policy([rule(), rule("tol", Severity.TOLERATE)], name="demo")
        record = policy.decide_and_count(make_ctx(node_hours=5.0)).to_record()
        assert json.loads(json.dumps(record)) == record
        assert record["kind"] == "block"
        assert record["code"] == "policy_denied"
        assert record["severities"] == {"big": "HARD_STOP", "tol": "TOLERATE"}
        assert record["policy"] == "demo"


def when_raising(ctx: RoundContext) -> bool:
    raise LookupError("broken condition")


class TestConditions:
    def test_callable_detail_is_reported(self, make_ctx: MakeContext) -> None:
        decision = Policy([Rule(name="py", when=lambda c: "too many rounds")]).decide_and_count(
            make_ctx()
        )
        assert decision.fired[0].detail == "too many rounds"

    def test_callable_returning_none_does_not_fire(self, make_ctx: MakeContext) -> None:
        assert (
            Policy([Rule(name="py", when=lambda c: None)]).decide_and_count(make_ctx()).fired == ()
        )

    def test_failing_condition_fails_closed(self, make_ctx: MakeContext) -> None:
        decision = Policy([Rule(name="py", when=when_raising)]).decide_and_count(make_ctx())
        assert isinstance(decision.outcome, Block)
        assert "LookupError" in decision.fired[0].detail

    def test_cel_reads_walltime_flag(self, make_ctx: MakeContext) -> None:
        policy = Policy(
            [
                Rule(
                    name="late",
                    when="allocation.has_walltime && allocation.walltime_remaining < 600.0",
                )
            ]
        )
        assert policy.decide_and_count(make_ctx()).outcome == Continue()
        assert isinstance(policy.decide_and_count(make_ctx(walltime_remaining=60.0)).outcome, Block)

    def test_cel_reads_history(self, make_ctx: MakeContext) -> None:
        policy = Policy([Rule(name="h", when="history.decisions.exists(d, d == 'suspend')")])
        assert policy.decide_and_count(make_ctx(earlier_decisions=("continue",))).fired == ()
        assert policy.decide_and_count(make_ctx(earlier_decisions=("suspend",))).fired

    def test_cel_reads_candidates(self, make_ctx: MakeContext) -> None:
        policy = Policy([Rule(name="c", when="batch.candidates.exists(c, c[0] > 0.9)")])
        assert policy.decide_and_count(make_ctx(candidates=[[0.1], [0.2]])).fired == ()
        assert policy.decide_and_count(make_ctx(candidates=[[0.1], [0.95]])).fired

    def test_cel_reads_gate_and_budget(self, make_ctx: MakeContext) -> None:
        when = "gate.disposition == 'fallback' && gate.consecutive_fallbacks >= 2"
        policy = Policy([Rule(name="g", when=when + " && budget.spent < budget.remaining")])
        assert policy.decide_and_count(
            make_ctx(disposition="fallback", consecutive_fallbacks=2)
        ).fired
        assert not policy.decide_and_count(make_ctx(disposition="accepted")).fired

    @pytest.mark.parametrize(
        ("when", "reads"),
        [
            ("batch.size > 1 && batch.node_hours > 1.0", False),
            ("round.index > 1", False),
            ("size(batch.candidates) > 1", True),
            ("has(batch.candidates)", True),
            ("batch['candidates'] == []", True),
        ],
    )
    def test_candidates_are_converted_only_when_read(self, when: str, reads: bool) -> None:
        assert Rule(name="r", when=when).reads_candidates is reads
