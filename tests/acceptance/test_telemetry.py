"""The gate's spans and evaluation records, checked with the SDK's in-memory exporters."""

from __future__ import annotations

import json

import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode

from acceptance import NotAccepted, Rejected, accept

pytestmark = pytest.mark.asyncio


def by_name(spans, name):
    return [s for s in spans if s.name == name]


def values(*items):
    def producer(previous):
        return items[len(previous)]

    return producer


def small(value):
    if value["x"] < 3:
        raise Rejected(f"x={value['x']} is below 3")


class TestSpans:
    async def test_gate_span_has_name_budget_used_and_disposition(self, otel):
        await accept(values({"x": 1}, {"x": 5}), checks=[small], attempts=3, name="planner")
        (gate,) = by_name(otel.spans(), "accept planner")
        assert gate.kind is SpanKind.INTERNAL
        assert gate.attributes["unattended.accept.name"] == "planner"
        assert gate.attributes["unattended.accept.attempts.max"] == 3
        assert gate.attributes["unattended.accept.attempts.used"] == 2
        assert gate.attributes["unattended.accept.disposition"] == "accepted"
        assert gate.status.status_code is StatusCode.UNSET

    async def test_one_attempt_span_per_attempt_as_children_of_the_gate(self, otel):
        await accept(values({"x": 1}, {"x": 5}), checks=[small], attempts=3, name="planner")
        (gate,) = by_name(otel.spans(), "accept planner")
        attempts = by_name(otel.spans(), "accept.attempt planner")
        assert [s.attributes["unattended.accept.attempt"] for s in attempts] == [1, 2]
        assert all(s.parent.span_id == gate.context.span_id for s in attempts)
        # A rejection is not a failure: the rejected attempt's status stays unset.
        assert attempts[0].status.status_code is StatusCode.UNSET

    async def test_fallback_disposition(self, otel):
        await accept(values({"x": 1}), checks=[small], fallback=lambda: {"x": 9}, name="g")
        (gate,) = by_name(otel.spans(), "accept g")
        assert gate.attributes["unattended.accept.disposition"] == "fallback"
        assert gate.attributes["unattended.accept.attempts.used"] == 1

    async def test_not_accepted_marks_the_gate_span_error(self, otel):
        with pytest.raises(NotAccepted):
            await accept(values({"x": 1}), checks=[small], name="g")
        (gate,) = by_name(otel.spans(), "accept g")
        assert gate.attributes["unattended.accept.disposition"] == "not_accepted"
        assert gate.status.status_code is StatusCode.ERROR
        assert gate.attributes["error.type"] == "NotAccepted"

    async def test_failure_marks_the_gate_span_error_with_its_type(self, otel):
        def broken(value):
            raise KeyError("boom")

        with pytest.raises(KeyError):
            await accept(values({"x": 1}), checks=[broken], name="g")
        (gate,) = by_name(otel.spans(), "accept g")
        assert gate.status.status_code is StatusCode.ERROR
        assert gate.attributes["error.type"] == "KeyError"

    async def test_producer_spans_nest_under_the_attempt_span(self, otel):
        tracer = trace.get_tracer("test.producer")

        def producer(previous):
            with tracer.start_as_current_span("model call"):
                return {"x": 5}

        await accept(producer, name="g")
        (call,) = by_name(otel.spans(), "model call")
        (attempt,) = by_name(otel.spans(), "accept.attempt g")
        assert call.parent.span_id == attempt.context.span_id

    async def test_attempt_records_its_trace_and_span_ids(self, otel):
        outcome = await accept(values({"x": 5}), name="g")
        (attempt_span,) = by_name(otel.spans(), "accept.attempt g")
        recorded = outcome.attempts[0]
        assert recorded.trace_id == format(attempt_span.context.trace_id, "032x")
        assert recorded.span_id == format(attempt_span.context.span_id, "016x")


class TestEvaluationRecords:
    async def test_one_record_per_check_that_ran_under_the_attempt_span(self, otel):
        def first(value):
            return None

        def third(value):
            return None

        await accept(values({"x": 1}, {"x": 5}), checks=[first, small, third], attempts=2, name="g")
        records = [r.log_record for r in otel.logs()]
        assert all(r.event_name == "gen_ai.evaluation.result" for r in records)
        seen = [
            (r.attributes["gen_ai.evaluation.name"], r.attributes["gen_ai.evaluation.score.label"])
            for r in records
        ]
        # attempt 1: first passes, small fails (third never runs); attempt 2: all pass.
        assert seen == [
            ("first", "pass"),
            ("small", "fail"),
            ("first", "pass"),
            ("small", "pass"),
            ("third", "pass"),
        ]
        assert records[1].attributes["gen_ai.evaluation.explanation"] == "x=1 is below 3"
        attempt_spans = by_name(otel.spans(), "accept.attempt g")
        assert records[1].span_id == attempt_spans[0].context.span_id
        assert records[2].span_id == attempt_spans[1].context.span_id

    async def test_producer_rejection_emits_a_record(self, otel):
        def producer(previous):
            raise Rejected("cut off", check="truncation")

        with pytest.raises(NotAccepted):
            await accept(producer, name="g")
        (record,) = [r.log_record for r in otel.logs()]
        assert record.attributes["gen_ai.evaluation.name"] == "truncation"
        assert record.attributes["gen_ai.evaluation.score.label"] == "fail"
        assert record.attributes["gen_ai.evaluation.explanation"] == "cut off"

    async def test_scores_emit_score_values(self, otel):
        await accept(values({"x": 5}), scores=[lambda v: 0.25], name="g")
        (record,) = [r.log_record for r in otel.logs()]
        assert record.attributes["gen_ai.evaluation.name"] == "<lambda>"
        assert record.attributes["gen_ai.evaluation.score.value"] == 0.25

    async def test_response_id_is_carried_when_the_value_has_one(self, otel):
        await accept(values({"x": 5, "response_id": "chatcmpl-42"}), checks=[small], name="g")
        (record,) = [r.log_record for r in otel.logs()]
        assert record.attributes["gen_ai.response.id"] == "chatcmpl-42"


class TestCaptureContent:
    async def test_rejected_value_is_not_on_the_span_by_default(self, otel):
        await accept(values({"x": 1}), checks=[small], fallback=lambda: {"x": 9}, name="g")
        (attempt,) = by_name(otel.spans(), "accept.attempt g")
        assert "unattended.accept.value" not in attempt.attributes

    @pytest.mark.parametrize("mode", ["SPAN_ONLY", "SPAN_AND_EVENT", "span_only"])
    async def test_rejected_value_is_on_the_span_when_capture_is_on(self, otel, monkeypatch, mode):
        monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", mode)
        await accept(values({"x": 1}), checks=[small], fallback=lambda: {"x": 9}, name="g")
        (attempt,) = by_name(otel.spans(), "accept.attempt g")
        assert json.loads(attempt.attributes["unattended.accept.value"]) == {"x": 1}

    async def test_other_capture_modes_keep_the_value_off(self, otel, monkeypatch):
        monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "EVENT_ONLY")
        await accept(values({"x": 1}), checks=[small], fallback=lambda: {"x": 9}, name="g")
        (attempt,) = by_name(otel.spans(), "accept.attempt g")
        assert "unattended.accept.value" not in attempt.attributes
