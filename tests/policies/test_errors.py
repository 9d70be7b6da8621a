"""The error taxonomy, and proof that no proposal content leaks into decisions or errors."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from pydantic import BaseModel, ValidationError

from acceptance import Attempt, NotAccepted
from policies import (
    CODES,
    ApprovalRejected,
    ApprovalTimeout,
    BatchSummary,
    BudgetExceeded,
    DeadlineExceeded,
    InternalError,
    NotAcceptedError,
    Policy,
    PolicyDenied,
    ProviderError,
    RoundContext,
    Rule,
    Severity,
    UnattendedError,
    ValidationFailed,
    classify,
    proposal_key,
)

CANARY = "sk-CANARY-5e1d0c9b"
# Candidate values whose text would betray the proposal if it were quoted.
CANARY_NUMBERS = (1234.56789101112, 0.000987654321234)


class Proposal(BaseModel):
    candidates: list[list[float]]
    rationale: str


def secret_proposal() -> Proposal:
    return Proposal(
        candidates=[[CANARY_NUMBERS[0], 2.0], [3.0, CANARY_NUMBERS[1]], [7.5]],
        rationale=f"use the key {CANARY} to reach the cluster",
    )


def assert_clean(text: str) -> None:
    assert CANARY not in text
    for number in CANARY_NUMBERS:
        assert repr(number) not in text
        assert str(number) not in text


class TestClassify:
    def test_taxonomy_error_passes_through(self) -> None:
        error = PolicyDenied("rule 'x' denied the round")
        assert classify(error) is error

    def test_not_accepted_becomes_not_accepted_error(self) -> None:
        attempts = (
            Attempt[Proposal](number=1, rejected_by="schema", reason=CANARY, duration=0.0),
            Attempt[Proposal](number=2, value=secret_proposal(), rejected_by="d", duration=0.0),
        )
        error = classify(NotAccepted("planner", attempts))
        assert isinstance(error, NotAcceptedError)
        assert error.code == "not_accepted"
        assert error.details["attempts"] == 2
        assert_clean(json.dumps(error.to_dict()))

    def test_validation_error_names_fields_not_values(self) -> None:
        with pytest.raises(ValidationError) as caught:
            Proposal.model_validate({"candidates": CANARY, "rationale": 3})
        error = classify(caught.value)
        assert isinstance(error, ValidationFailed)
        assert error.details["fields"] == ["candidates", "rationale"]
        assert_clean(json.dumps(error.to_dict()))

    def test_timeout_becomes_deadline_exceeded(self) -> None:
        error = classify(TimeoutError(CANARY))
        assert isinstance(error, DeadlineExceeded)
        assert error.code == "deadline_exceeded"
        assert_clean(json.dumps(error.to_dict()))

    def test_anything_else_is_internal(self) -> None:
        error = classify(KeyError(CANARY))
        assert isinstance(error, InternalError)
        assert error.code == "internal"
        assert error.details == {"cause": "KeyError"}
        assert_clean(json.dumps(error.to_dict()))

    def test_retryable_is_data(self) -> None:
        assert ProviderError("endpoint 503").retryable
        assert not ProviderError("endpoint 400", retryable=False).retryable
        assert not PolicyDenied("x").retryable

    def test_unknown_code_is_refused(self) -> None:
        with pytest.raises(ValueError, match="unknown error code"):
            UnattendedError("x", code="made_up")

    def test_every_class_code_is_listed(self) -> None:
        def subclasses(cls: type[UnattendedError]) -> list[type[UnattendedError]]:
            found = []
            for sub in cls.__subclasses__():
                found += [sub, *subclasses(sub)]
            return found

        assert {sub.code for sub in subclasses(UnattendedError)} <= set(CODES)


def leaking_rule(proposal: Proposal) -> Callable[[RoundContext], bool]:
    """A badly written condition whose failure message quotes the proposal."""

    def check(ctx: RoundContext) -> bool:
        raise ValueError(f"cannot judge {proposal.rationale} {proposal.candidates}")

    return check


class TestNoContentLeaks:
    def test_decisions_and_feedback_never_quote_the_proposal(self) -> None:
        proposal = secret_proposal()
        ctx = RoundContext(
            campaign="canary-campaign",
            round_index=2,
            attempt=1,
            batch=BatchSummary(size=3, candidates=proposal.candidates, node_hours=12.5),
            proposal_key=proposal_key(proposal.candidates),
            disposition="accepted",
            consecutive_fallbacks=0,
            budget_spent=10.0,
            budget_remaining=5.0,
        )
        policy = Policy(
            [
                Rule(
                    name="big",
                    when="batch.node_hours > 4.0",
                    severity=Severity.ASK,
                    approvers=("alice",),
                    advice="Propose fewer candidates.",
                ),
                Rule(
                    name="far",
                    when="batch.candidates.exists(c, c[0] > 1000.0)",
                    severity=Severity.SOFT_BLOCK,
                ),
                # Passes the load-time trial, then meets a one-element candidate: a CEL error.
                Rule(
                    name="second",
                    when="batch.candidates.all(c, c[1] >= 0.0)",
                    severity=Severity.PERSISTENT_BLOCK,
                ),
                Rule(name="leaky", when=leaking_rule(proposal), severity=Severity.BLOCK_AND_WARN),
                Rule(
                    name="budget",
                    when="budget.remaining < budget.spent",
                    severity=Severity.TOLERATE,
                ),
                Rule(name="shadow", when="size(batch.candidates) > 1", log_only=True),
            ],
            name="canary-policy",
        )
        decisions = [
            policy.decide_and_count(ctx),
            policy.decide_and_count(ctx.model_copy(update={"attempt": 2})),
        ]
        fired = {firing.rule for firing in decisions[0].fired}
        assert fired == {"big", "far", "second", "leaky", "budget", "shadow"}
        for decision in decisions:
            assert "12.5" in decision.feedback  # numbers about the batch may be quoted
            assert_clean(decision.feedback)
            assert_clean(json.dumps(decision.to_record()))
            assert_clean(repr(decision))
        assert_clean(json.dumps(policy.to_state()))


class TestRunStatus:
    """How a campaign stopped by an error ends is data on the error, like its code."""

    @pytest.mark.parametrize(
        "error",
        [
            PolicyDenied("r"),
            BudgetExceeded("r"),
            ApprovalRejected("r"),
            ApprovalTimeout("r"),
        ],
    )
    def test_a_deliberate_stop_blocks_the_run(self, error):
        assert error.run_status == "blocked"

    def test_any_other_error_leaves_no_status_so_the_run_failed(self):
        assert InternalError("r").run_status is None
        assert DeadlineExceeded("r").run_status is None

    def test_the_raiser_may_say_the_run_escalated(self):
        error = PolicyDenied("r", run_status="escalated")
        assert (error.code, error.run_status) == ("policy_denied", "escalated")
