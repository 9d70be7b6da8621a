"""The report's figures and approvals, read back from the generated HTML only.

Each figure is embedded with ``data-figure``: what its Axes and legends show,
read from the matplotlib objects that drew the PNG. These tests parse that and
the approvals tables out of ``report.html`` of real recorded campaigns (the
approval demo, and the same demo with a zero-crossing objective and a subset
approval; see ``conftest.py``).
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from flows._provenance import ProvenanceStore
from flows._report import collect

pytestmark = pytest.mark.timeout(180)

UTC_TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"


class _ReportReader(HTMLParser):
    """Collect the figures' descriptions and every table's rows by section (``h2`` id)."""

    def __init__(self) -> None:
        super().__init__()
        self.figures: dict[str, dict[str, Any]] = {}
        self.tables: dict[str, list[list[list[str]]]] = {}
        self._section = ""
        self._row: list[str] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "h2":
            self._section = found.get("id") or ""
        elif tag == "figure":
            self.figures[found["data-name"] or ""] = json.loads(found["data-figure"] or "")
        elif tag == "table":
            self.tables.setdefault(self._section, []).append([])
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = []

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._row is not None and self._cell is not None:
            self._row.append("".join(self._cell))
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.tables[self._section][-1].append(self._row)
            self._row = None


def read_report(path: Path) -> _ReportReader:
    reader = _ReportReader()
    reader.feed(path.read_text())
    return reader


def rows(table: list[list[str]]) -> list[dict[str, str]]:
    """Return a table's body rows keyed by its header."""
    header, *body = table
    return [dict(zip(header, row, strict=True)) for row in body]


def axes_by_label(figure: dict[str, Any], label: str) -> dict[str, Any]:
    """Return the Axes of ``figure`` with an x or y label starting with ``label``."""
    found: dict[str, Any]
    (found,) = [
        a
        for a in figure["axes"]
        if a.get("xlabel", "").startswith(label) or a.get("ylabel", "").startswith(label)
    ]
    return found


def line(axes: dict[str, Any], label: str) -> list[float]:
    (found,) = [entry["y"] for entry in axes["lines"] if entry["label"] == label]
    return list(found)


def overlap(a: list[float], b: list[float]) -> bool:
    """Return True when two [x0, y0, x1, y1] boxes share an area."""
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


@pytest.fixture(scope="module")
def recorded(recorded_report: Any, recorded_campaign: Any) -> tuple[_ReportReader, dict[str, Any]]:
    """The approval demo's report, parsed, and what ``collect`` reads from its store."""
    with ProvenanceStore.open(recorded_campaign.database, read_only=True) as store:
        data = collect(store, recorded_campaign.name)
    return read_report(recorded_report.path), data


@pytest.fixture(scope="module")
def subset(
    subset_campaign: Any, report_writer: Any, tmp_path_factory: pytest.TempPathFactory
) -> tuple[_ReportReader, dict[str, Any]]:
    """The subset campaign's report (written through the CLI), parsed, and its store's data."""
    written = report_writer(subset_campaign, tmp_path_factory.mktemp("subset-report"))
    with ProvenanceStore.open(subset_campaign.database, read_only=True) as store:
        data = collect(store, subset_campaign.name)
    return read_report(written.path), data


class TestBestResultFigure:
    def test_positive_objectives_are_drawn_raw_on_a_log_axis_said_on_the_axis(
        self, recorded: tuple[_ReportReader, dict[str, Any]]
    ) -> None:
        report, data = recorded
        axes = axes_by_label(report.figures["best.png"], "objective")
        assert axes["yscale"] == "log"
        assert axes["ylabel"] == "objective (log scale)"
        assert line(axes, "round best") == [r["best"] for r in data["rounds"]]
        assert line(axes, "best so far") == [r["best_so_far"] for r in data["rounds"]]
        assert line(axes, "best so far")[-1] == data["best_result"]["objective"] > 0

    def test_the_log_axis_is_labelled_with_plain_numbers_spanning_the_values(
        self, recorded: tuple[_ReportReader, dict[str, Any]]
    ) -> None:
        report, _ = recorded
        axes = axes_by_label(report.figures["best.png"], "objective")
        ticks = axes["yticks"]
        assert len(ticks) >= 2
        for tick in ticks:
            assert float(tick["label"]) == pytest.approx(tick["value"])  # "0.001", not 10^-3
        values = line(axes, "round best")
        labelled = [t["value"] for t in ticks]
        assert min(labelled) <= 10 * min(values)
        assert max(labelled) >= max(values) / 10

    def test_objectives_that_cross_zero_are_drawn_on_a_linear_axis(
        self, subset: tuple[_ReportReader, dict[str, Any]]
    ) -> None:
        report, data = subset
        axes = axes_by_label(report.figures["best.png"], "objective")
        values = line(axes, "round best")
        assert values == [r["best"] for r in data["rounds"]]
        assert min(values) <= 0 < max(values)
        assert axes["yscale"] == "linear"
        assert axes["ylabel"] == "objective (linear scale, values ≤ 0)"
        ticks = axes["yticks"]
        assert len(ticks) >= 2
        for tick in ticks:  # raw values: no offset or multiplier shown apart
            assert float(tick["label"].replace("\u2212", "-")) == pytest.approx(tick["value"])


class TestLegends:
    @pytest.mark.parametrize("name", ["best.png", "dispositions.png"])
    def test_the_legend_lies_outside_every_axes(
        self, recorded: tuple[_ReportReader, dict[str, Any]], name: str
    ) -> None:
        figure = recorded[0].figures[name]
        (legend,) = figure["legends"]
        assert legend["labels"]
        for axes in figure["axes"]:
            assert not overlap(legend["box"], axes["box"]), (legend, axes["box"])

    def test_the_dispositions_legend_names_the_bars_and_the_rate(
        self, recorded: tuple[_ReportReader, dict[str, Any]]
    ) -> None:
        (legend,) = recorded[0].figures["dispositions.png"]["legends"]
        assert legend["labels"] == ["accepted", "fallback", "acceptance rate"]


class TestIntegerTicks:
    @pytest.mark.parametrize(
        ("name", "label", "axis"),
        [
            ("best.png", "round", "x"),
            ("dispositions.png", "round", "x"),
            ("dispositions.png", "gate calls", "y"),
            ("rejections.png", "rejected attempts", "x"),
        ],
    )
    def test_counts_are_ticked_at_whole_numbers(
        self, recorded: tuple[_ReportReader, dict[str, Any]], name: str, label: str, axis: str
    ) -> None:
        axes = axes_by_label(recorded[0].figures[name], label)
        ticks = axes[f"{axis}ticks"]
        assert len(ticks) >= 2
        for tick in ticks:
            assert tick["value"] == int(tick["value"])
            assert tick["label"] == str(int(tick["value"]))


class TestApprovals:
    def test_a_subset_approval_says_how_many_of_how_many_which_by_whom_and_when(
        self, subset: tuple[_ReportReader, dict[str, Any]]
    ) -> None:
        report, data = subset
        (request,) = rows(report.tables["approvals"][0])
        assert request["round"] == "2"
        assert request["rule"] == "review-round-2"
        assert re.fullmatch(
            rf"3 of 8 candidates \(#0, #2, #5\) approved by alice at {UTC_TIME}",
            request["answer"],
        ), request["answer"]
        (batch,) = [b for b in data["batches"] if b["round_index"] == 2]
        assert batch["candidates"] == 3  # what ran is what the line says

    def test_an_approval_of_the_whole_batch_and_a_refused_answer_are_both_listed(
        self, recorded: tuple[_ReportReader, dict[str, Any]]
    ) -> None:
        report, _ = recorded
        settled, answers = report.tables["approvals"]
        (request,) = rows(settled)
        assert re.fullmatch(
            rf"all 8 candidates approved by alice at {UTC_TIME}", request["answer"]
        ), request["answer"]
        assert request["comment"] == "round 2 reviewed"
        assert request["refused answers"] == "1"
        assert [(a["by"], a["answer"], a["counted"]) for a in rows(answers)] == [
            ("mallory", "not_allowed", "no: not among the approvers"),
            ("alice", "approved", "yes"),
        ]


def _fill_rounds(store: ProvenanceStore, name: str, rounds: int) -> None:
    """Record ``rounds`` rounds of one accepted gate call and a batch of three tasks."""
    store.ensure_campaign(name, spec={"rounds": rounds}, site="local", seed=1, code_version="t")
    for index in range(rounds):
        call = store.record_gate_call(
            name, index, 0, gate="planner", budget=1, fallback_hash="h", fallback_value=[[0.5]]
        )
        store.finish_gate_call(call, "accepted" if index % 4 else "fallback", 1)
        store.record_decision(name, index, 0, {"outcome": "continue", "reason": "ok"})
        key = f"{name}-{index}"
        store.record_batch_launched(
            key, campaign=name, round_index=index, candidates=[[0.1], [0.2], [0.3]], backend="local"
        )
        results = [
            {"index": i, "key": f"{key}-{i}", "status": "done", "value": 1.0 / (index + 1)}
            | {"runtime": 0.1 * (i + 1), "host": "n", "exit_code": 0, "attempts": 1}
            for i in range(3)
        ]
        store.record_batch_results(key, results)
        store.checkpoint_round(
            name, index, surrogate_state={}, policy_state={}, planner_state={}, status="completed"
        )


MANY_ROUNDS = 75


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> _ReportReader:
    """The report of a campaign of more rounds than ``MANY``."""
    from flows._report import write_report
    from flows._report_figures import MANY

    assert MANY_ROUNDS > MANY
    folder = tmp_path_factory.mktemp("many")
    with ProvenanceStore.open(str(folder / "provenance.db")) as store:
        _fill_rounds(store, "long", MANY_ROUNDS)
        return read_report(write_report(store, "long", folder / "report"))


class TestManyRounds:
    """Past ``MANY`` rounds the figures summarise instead of drawing a bar or box per round."""

    def test_the_batches_are_labelled_at_a_few_rounds_not_at_every_one(
        self, many: _ReportReader
    ) -> None:
        axes = axes_by_label(many.figures["simulation.png"], "batch")
        labels = [tick["label"] for tick in axes["xticks"]]
        assert 2 <= len(labels) <= 12, labels
        assert labels[0] == "r0"
        assert all(re.fullmatch(r"r\d+", label) for label in labels), labels

    def test_the_runtimes_are_a_median_line_over_every_batch(self, many: _ReportReader) -> None:
        axes = axes_by_label(many.figures["simulation.png"], "batch")
        assert line(axes, "median") == [pytest.approx(0.2)] * MANY_ROUNDS
        (legend,) = many.figures["simulation.png"]["legends"]
        assert legend["labels"] == ["wall time", "fastest to slowest", "median"]
        for each in many.figures["simulation.png"]["axes"]:
            assert not overlap(legend["box"], each["box"])

    def test_the_dispositions_keep_their_legend_and_the_rate_of_every_round(
        self, many: _ReportReader
    ) -> None:
        figure = many.figures["dispositions.png"]
        (legend,) = figure["legends"]
        assert legend["labels"] == ["accepted", "fallback", "acceptance rate"]
        rate = line(axes_by_label(figure, "acceptance rate"), "acceptance rate")
        assert rate == [0.0 if index % 4 == 0 else 1.0 for index in range(MANY_ROUNDS)]
