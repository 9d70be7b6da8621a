"""``parse_completion`` on arbitrary input: a proposal, a rejection or a provider error."""

from __future__ import annotations

import contextlib
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from acceptance import Rejected
from policies import ProviderError
from tasks import Bounds, Proposal, parse_completion, planner_checks

json_values = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=30,
)


def body_with(content: Any, **message: Any) -> dict[str, Any]:
    return {"choices": [{"message": {"content": content, **message}, "finish_reason": "stop"}]}


class TestParseCompletion:
    @settings(max_examples=200, deadline=None)
    @given(json_values)
    def test_any_body_gives_a_proposal_a_rejection_or_a_provider_error(self, body: Any) -> None:
        with contextlib.suppress(Rejected, ProviderError):
            parse_completion(body)

    @settings(max_examples=200, deadline=None)
    @given(json_values)
    def test_any_json_answer_gives_a_proposal_or_a_schema_rejection(self, answer: Any) -> None:
        try:
            result: Proposal | Rejected = parse_completion(body_with(json.dumps(answer)))
        except Rejected as exc:
            result = exc
        assert isinstance(result, Proposal) or result.check == "schema"

    @settings(max_examples=200, deadline=None)
    @given(st.text(max_size=200))
    def test_any_text_answer_never_leaks_into_the_reason(self, text: str) -> None:
        reason = ""
        try:
            parse_completion(body_with("ZQXJ" + text))
        except Rejected as exc:
            reason = exc.reason
        assert "ZQXJ" not in reason

    def test_deeply_nested_answer_is_a_schema_rejection(self) -> None:
        deep = '{"rationale": "r", "candidates": ' + "[" * 50_000 + "]" * 50_000 + "}"
        with pytest.raises(Rejected, match="recursion limit") as caught:
            parse_completion(body_with(deep))
        assert caught.value.check == "schema"

    def test_oversized_answer_is_rejected_unread(self) -> None:
        with pytest.raises(Rejected, match="the limit is 1000000"):
            parse_completion(body_with(" " * 1_000_001))

    def test_invented_keys_are_shortened_in_the_reason(self) -> None:
        answer = {"rationale": "r", "candidates": [], "k" * 500: 1}
        with pytest.raises(Rejected) as caught:
            parse_completion(body_with(json.dumps(answer)))
        assert len(caught.value.reason) < 200


class TestChecksOnAnything:
    @settings(max_examples=200, deadline=None)
    @given(
        st.lists(st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=4), max_size=10)
    )
    def test_checks_pass_or_reject_and_never_crash(self, candidates: list[list[float]]) -> None:
        bounds = Bounds.unit(2)
        try:
            for check in planner_checks(bounds, 3):
                check(candidates)
        except Rejected:
            return
        assert len(candidates) == 3
        assert all(len(c) == 2 and all(0 <= v <= 1 for v in c) for c in candidates)
        assert all(math.isfinite(v) for c in candidates for v in c)
