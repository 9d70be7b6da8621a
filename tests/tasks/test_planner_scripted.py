"""``ScriptedPlanner`` and the shipped demo transcript."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from acceptance import Outcome, Rejected, accept
from policies import ProviderError, SpecInvalid
from tasks import (
    Bounds,
    GaussianProcess,
    Proposal,
    ScriptedPlanner,
    candidates_hash,
    fallback_batch,
    planner_checks,
)
from tasks.demo import objective

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo" / "transcript.jsonl"
UNIT2 = Bounds.unit(2)
GOOD = [[0.1, 0.2], [0.3, 0.4]]


def write(tmp_path: Path, *records: Any) -> Path:
    path = tmp_path / "transcript.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


async def run_round(
    planner: ScriptedPlanner, surrogate: GaussianProcess, seed: int
) -> Outcome[Proposal]:
    """Run one demo round: fallback first, then the gate, then the evaluations."""
    fallback = fallback_batch(surrogate, UNIT2, 8, seed)
    outcome = await accept(
        planner,
        checks=planner_checks(UNIT2, 8),
        attempts=3,
        fallback=fallback.to_proposal,
        name="planner",
    )
    batch = outcome.value.candidates
    surrogate.assimilate(batch, [objective(x) for x in batch])
    return outcome


class TestRecords:
    @pytest.mark.asyncio
    async def test_short_answer_record_gives_a_proposal(self, tmp_path: Path) -> None:
        path = write(tmp_path, {"id": "r1", "answer": {"rationale": "r", "candidates": GOOD}})
        proposal = await ScriptedPlanner(path)(())
        assert proposal == Proposal(rationale="r", candidates=GOOD, response_id="r1")

    @pytest.mark.asyncio
    async def test_answer_may_be_the_raw_text(self, tmp_path: Path) -> None:
        text = json.dumps({"rationale": "r", "candidates": GOOD})
        path = write(tmp_path, {"answer": text})
        assert (await ScriptedPlanner(path)(())).candidates == GOOD

    @pytest.mark.asyncio
    async def test_full_response_body_is_replayed(self, tmp_path: Path) -> None:
        content = json.dumps({"rationale": "r", "candidates": GOOD})
        body = {
            "id": "full",
            "choices": [
                {"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
            ],
        }
        path = write(tmp_path, body)
        assert (await ScriptedPlanner(path)(())).response_id == "full"

    @pytest.mark.asyncio
    @pytest.mark.parametrize(
        ("record", "check"),
        [
            ({"refusal": "no"}, "refusal"),
            ({"answer": '{"rationale": "cut', "finish_reason": "length"}, "truncation"),
            ({"answer": "not json at all"}, "schema"),
            ({"answer": {"rationale": "r"}}, "schema"),
            ({"answer": ""}, "schema"),
        ],
    )
    async def test_recorded_problems_reject_like_live_ones(
        self, tmp_path: Path, record: dict[str, Any], check: str
    ) -> None:
        with pytest.raises(Rejected) as caught:
            await ScriptedPlanner(write(tmp_path, record))(())
        assert caught.value.check == check

    @pytest.mark.asyncio
    async def test_malformed_body_is_a_provider_error(self, tmp_path: Path) -> None:
        path = write(tmp_path, {"choices": []})
        with pytest.raises(ProviderError, match="malformed"):
            await ScriptedPlanner(path)(())

    def test_blank_lines_are_skipped(self, tmp_path: Path) -> None:
        path = tmp_path / "t.jsonl"
        path.write_text('\n{"answer": "x"}\n\n{"refusal": "no"}\n')
        assert len(ScriptedPlanner(path)) == 2


class TestBadTranscripts:
    def test_missing_file_is_named(self, tmp_path: Path) -> None:
        with pytest.raises(SpecInvalid, match=r"missing\.jsonl: cannot read the transcript"):
            ScriptedPlanner(tmp_path / "missing.jsonl")

    @pytest.mark.parametrize(
        ("line", "message"),
        [
            ("{not json", "not a JSON object"),
            ("[1, 2]", "a record must be a JSON object"),
            ('{"answr": "x"}', "unknown field 'answr'"),
            ('{"note": "only a note"}', "needs 'choices', 'answer' or 'refusal'"),
        ],
    )
    def test_bad_line_is_named_with_file_and_number(
        self, tmp_path: Path, line: str, message: str
    ) -> None:
        path = tmp_path / "t.jsonl"
        path.write_text('{"answer": "fine"}\n' + line + "\n")
        with pytest.raises(SpecInvalid, match=message) as caught:
            ScriptedPlanner(path)
        assert str(caught.value).startswith(f"{path}:2: ")
        assert caught.value.details == {"path": str(path), "line": 2}

    def test_position_past_the_end_is_refused(self, tmp_path: Path) -> None:
        with pytest.raises(ValueError, match="position 2 is outside"):
            ScriptedPlanner(write(tmp_path, {"answer": "x"}), position=2)


class TestPosition:
    @pytest.mark.asyncio
    async def test_each_call_uses_the_next_answer(self, tmp_path: Path) -> None:
        path = write(
            tmp_path,
            {"id": "a", "answer": {"rationale": "r", "candidates": GOOD}},
            {"id": "b", "answer": {"rationale": "r", "candidates": GOOD}},
        )
        planner = ScriptedPlanner(path)
        assert (await planner(())).response_id == "a"
        assert planner.position == 1
        assert (await planner(())).response_id == "b"
        assert planner.remaining == 0

    @pytest.mark.asyncio
    async def test_a_rejected_answer_still_moves_on(self, tmp_path: Path) -> None:
        planner = ScriptedPlanner(write(tmp_path, {"refusal": "no"}, {"answer": "x"}))
        with pytest.raises(Rejected):
            await planner(())
        assert planner.position == 1

    @pytest.mark.asyncio
    async def test_running_out_is_a_failure_not_a_rejection(self, tmp_path: Path) -> None:
        planner = ScriptedPlanner(write(tmp_path, {"refusal": "no"}))
        with pytest.raises(ProviderError, match="no answer left after 1") as caught:
            await accept(planner, attempts=3, name="planner")
        assert caught.value.retryable is False

    @pytest.mark.asyncio
    async def test_resumed_planner_continues_where_it_stopped(self, tmp_path: Path) -> None:
        path = write(
            tmp_path,
            {"id": "a", "answer": {"rationale": "r", "candidates": GOOD}},
            {"id": "b", "answer": {"rationale": "r", "candidates": GOOD}},
        )
        first = ScriptedPlanner(path)
        await first(())
        resumed = ScriptedPlanner(path, position=first.position)
        assert (await resumed(())).response_id == "b"


class TestDemoTranscript:
    @pytest.mark.asyncio
    async def test_four_rounds_show_every_rejection_and_a_fallback(self) -> None:
        planner = ScriptedPlanner(DEMO)
        surrogate = GaussianProcess()
        outcomes = [await run_round(planner, surrogate, seed) for seed in range(4)]
        assert [o.disposition for o in outcomes] == ["accepted", "fallback", "accepted", "accepted"]
        assert [[a.rejected_by for a in o.attempts] for o in outcomes] == [
            ["finite", None],
            ["within_bounds", "batch_size", "refusal"],
            [None],
            ["truncation", None],
        ]
        assert planner.remaining == 0
        assert surrogate.observations == 32

    @pytest.mark.asyncio
    async def test_fallback_round_runs_the_recorded_fallback_batch(self) -> None:
        planner = ScriptedPlanner(DEMO)
        surrogate = GaussianProcess()
        await run_round(planner, surrogate, 0)
        expected = fallback_batch(surrogate, UNIT2, 8, 1)
        outcome = await run_round(planner, surrogate, 1)
        assert candidates_hash(outcome.value.candidates) == expected.content_hash

    @pytest.mark.asyncio
    async def test_resumed_demo_continues_with_round_three(self) -> None:
        planner = ScriptedPlanner(DEMO)
        surrogate = GaussianProcess()
        for seed in range(2):
            await run_round(planner, surrogate, seed)
        checkpoint = {"position": planner.position, "surrogate": surrogate.to_state()}
        saved = json.loads(json.dumps(checkpoint))
        resumed = ScriptedPlanner(DEMO, position=saved["position"])
        outcome = await run_round(resumed, GaussianProcess.from_state(saved["surrogate"]), 2)
        assert outcome.value.response_id == "chatcmpl-demo-06"

    @pytest.mark.asyncio
    async def test_the_campaign_gets_close_to_the_minimum(self) -> None:
        planner = ScriptedPlanner(DEMO)
        surrogate = GaussianProcess()
        for seed in range(4):
            await run_round(planner, surrogate, seed)
        assert min(surrogate.to_state()["values"]) < 0.05
