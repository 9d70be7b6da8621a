"""Telemetry out of the box: a campaign's spans and evaluation records reach an OTLP receiver."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from flows._provenance import ProvenanceStore


class TestReceiver:
    def test_decodes_a_protobuf_trace_export(self, otlp_receiver: Any):
        request = ExportTraceServiceRequest()
        span = request.resource_spans.add().scope_spans.add().spans.add()
        span.name, span.trace_id, span.span_id = "s", b"\x01" * 16, b"\x02" * 8
        reply = httpx.post(
            f"{otlp_receiver.endpoint}/v1/traces",
            content=request.SerializeToString(),
            headers={"Content-Type": "application/x-protobuf"},
        )
        assert reply.status_code == 200
        assert [(s.name, s.trace_id) for s in otlp_receiver.spans] == [("s", "01" * 16)]

    def test_refuses_an_unknown_path(self, otlp_receiver: Any):
        reply = httpx.post(
            f"{otlp_receiver.endpoint}/v1/metrics",
            content=b"",
            headers={"Content-Type": "application/x-protobuf"},
        )
        assert reply.status_code == 404
        assert otlp_receiver.refused == ["/v1/metrics application/x-protobuf"]


class TestCampaignTelemetry:
    def test_the_campaign_the_rounds_and_the_gate_share_one_trace(self, shipped):
        receiver = shipped.receiver
        names = Counter(span.name for span in receiver.spans)
        assert names["campaign demo"] == 1
        assert all(names[f"round {i}"] == 1 for i in range(4))
        assert names["accept planner"] >= 4
        assert names["accept.attempt planner"] >= 4
        assert len({span.trace_id for span in receiver.spans}) == 1

    def test_gate_spans_nest_under_their_round_under_the_campaign(self, shipped):
        receiver = shipped.receiver
        by_id = {span.span_id: span for span in receiver.spans}
        (campaign,) = [s for s in receiver.spans if s.name == "campaign demo"]
        assert campaign.parent_span_id == ""
        rounds = [s for s in receiver.spans if s.name.startswith("round ")]
        assert all(s.parent_span_id == campaign.span_id for s in rounds)
        for gate in (s for s in receiver.spans if s.name == "accept planner"):
            assert by_id[gate.parent_span_id].name.startswith("round ")
            assert gate.attributes["unattended.accept.name"] == "planner"
        assert {s.service for s in receiver.spans} == {"unattended"}

    def test_evaluation_records_arrive_in_the_same_trace_under_attempt_spans(self, shipped):
        receiver = shipped.receiver
        evaluations = [log for log in receiver.logs if log.event_name == "gen_ai.evaluation.result"]
        assert evaluations
        (trace_id,) = {span.trace_id for span in receiver.spans}
        assert {log.trace_id for log in evaluations} == {trace_id}
        attempt_ids = {s.span_id for s in receiver.spans if s.name == "accept.attempt planner"}
        assert {log.span_id for log in evaluations} <= attempt_ids
        labels = {
            log.attributes.get("gen_ai.evaluation.score.label")
            for log in evaluations
            if "gen_ai.evaluation.score.value" not in log.attributes
        }
        assert labels == {"pass", "fail"}  # the demo's transcript has rejections

    def test_the_verifier_prediction_arrives_as_a_score_of_each_accepted_attempt(self, shipped):
        scores = [
            log
            for log in shipped.receiver.logs
            if log.event_name == "gen_ai.evaluation.result"
            and "gen_ai.evaluation.score.value" in log.attributes
        ]
        assert scores
        # The batch's highest prediction, and each candidate's (what candidate rules read).
        assert {log.attributes["gen_ai.evaluation.name"] for log in scores} == {
            "verifier_prediction",
            *(f"verifier_prediction.{i}" for i in range(8)),
        }
        assert all(0.0 <= log.attributes["gen_ai.evaluation.score.value"] <= 25.0 for log in scores)

    def test_provenance_attempts_carry_their_spans_ids(self, shipped):
        receiver, directory = shipped.receiver, shipped.directory
        store = ProvenanceStore.open(directory)
        try:
            recorded = {
                (attempt["trace_id"], attempt["span_id"])
                for index in range(4)
                for call in store.gate_calls("demo", index)
                for attempt in store.attempts(call["id"])
            }
        finally:
            store.close()
        attempt_spans = {
            (s.trace_id, s.span_id) for s in receiver.spans if s.name == "accept.attempt planner"
        }
        assert recorded == attempt_spans

    def test_the_json_lines_file_holds_the_same_spans(self, shipped):
        receiver, directory = shipped.receiver, shipped.directory
        lines = [json.loads(line) for line in (directory / "telemetry.jsonl").open()]
        from_file = {
            (line["name"], line["context"]["span_id"][2:])
            for line in lines
            if line["record"] == "span"
        }
        assert from_file == {(s.name, s.span_id) for s in receiver.spans}
        logs = [line for line in lines if line["record"] == "log"]
        assert len(logs) == len(receiver.logs)
