"""Write a campaign's offline HTML report from its provenance database.

The report is one self-contained HTML file (figures embedded as base64 PNG data
URIs, each in a ``<figure data-figure="...">`` whose JSON says what its axes show,
see :func:`flows._report_figures.describe`) plus the same PNG files beside it. It
reads only the provenance store, never Prefect or the allocation. Every recorded
value is HTML-escaped: proposals, rationales and rejection reasons come from an
agent and are untrusted.

matplotlib is imported lazily (Agg backend) when figures are drawn, so importing
this module stays cheap.
"""

from __future__ import annotations

import base64
import html
import json
import os
import statistics
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from flows._paths import private_dir
from flows._provenance import ProvenanceStore
from flows._provenance import _readers as readers
from flows._provenance import _tables as tables
from flows._report_approvals import (
    ANSWER_COLUMNS,
    REQUEST_COLUMNS,
    answer_rows,
    approvals,
    request_row,
    seconds_between,
)
from flows._report_figures import DrawnFigure, draw
from flows._words import count

REPORT_FILE = "report.html"
FIGURE_FILES = ("best.png", "dispositions.png", "rejections.png", "simulation.png")
_TOP_REASONS = 50
_RATIONALE_CHARS = 300


def _accepted(store: ProvenanceStore, cid: int) -> dict[int, dict[str, Any]]:
    """Return the accepted proposal's rationale and verifier prediction per round.

    The last accepted call of a round wins.
    """
    from flows._provenance._rows import PREDICTION_SCORE  # the name the engine records

    g, a = tables.GATE_CALLS.c, tables.ATTEMPTS.c
    query = (
        select(g.round_index, a.value, a.scores)
        .join(tables.ATTEMPTS, a.gate_call_id == g.id)
        .where(g.campaign_id == cid, g.disposition == "accepted", a.rejected_by.is_(None))
        .order_by(g.round_index, g.call_index)
    )
    found: dict[int, dict[str, Any]] = {}
    with store.engine.connect() as connection:
        for row in connection.execute(query):
            value = row.value if isinstance(row.value, dict) else {}
            scores = row.scores if isinstance(row.scores, dict) else {}
            rationale = value.get("rationale")
            prediction = scores.get(PREDICTION_SCORE)
            found[int(row.round_index)] = {
                "rationale": rationale if isinstance(rationale, str) else None,
                "prediction": prediction if isinstance(prediction, int | float) else None,
            }
    return found


def _rejections(store: ProvenanceStore, cid: int) -> list[dict[str, Any]]:
    """Return rejection reasons ranked by count: rejected_by, reason, count."""
    g, a = tables.GATE_CALLS.c, tables.ATTEMPTS.c
    count = func.count().label("n")
    query = (
        select(a.rejected_by, a.reason, count)
        .join(tables.GATE_CALLS, g.id == a.gate_call_id)
        .where(g.campaign_id == cid, a.rejected_by.is_not(None))
        .group_by(a.rejected_by, a.reason)
        .order_by(count.desc(), a.rejected_by, a.reason)
    )
    with store.engine.connect() as connection:
        return [
            {"rejected_by": r.rejected_by, "reason": r.reason or "", "count": int(r.n)}
            for r in connection.execute(query)
        ]


def _batches(store: ProvenanceStore, cid: int) -> list[dict[str, Any]]:
    """Return each batch's wall time (launched to finished) and its task runtimes."""
    b, t = tables.BATCHES.c, tables.TASK_RESULTS.c
    batches: dict[int, dict[str, Any]] = {}
    with store.engine.connect() as connection:
        for row in connection.execute(
            select(b.id, b.key, b.round_index, b.backend, b.candidates, b.status)
            .add_columns(b.launched_at, b.finished_at)
            .where(b.campaign_id == cid)
            .order_by(b.round_index, b.id)
        ):
            data = tables.plain_row(row)
            batches[int(row.id)] = {
                "key": row.key,
                "round_index": int(row.round_index),
                "backend": row.backend,
                "status": row.status,
                "candidates": len(row.candidates or []),
                "launched_at": data["launched_at"],
                "finished_at": data["finished_at"],
                "wall_seconds": seconds_between(data["launched_at"], data["finished_at"]),
                "runtimes": [],
                "done": 0,
                "failed": 0,
            }
        for row in connection.execute(
            select(t.batch_id, t.status, t.runtime).where(t.batch_id.in_(list(batches)))
        ):
            entry = batches[int(row.batch_id)]
            entry["done" if row.status == "done" else "failed"] += 1
            if row.runtime is not None:
                entry["runtimes"].append(float(row.runtime))
    for entry in batches.values():
        runtimes = entry.pop("runtimes")
        entry["runtime"] = (
            {
                "min": min(runtimes),
                "median": statistics.median(runtimes),
                "mean": statistics.fmean(runtimes),
                "max": max(runtimes),
            }
            if runtimes
            else None
        )
        entry["runtimes"] = runtimes
    return list(batches.values())


def collect(store: ProvenanceStore, name: str) -> dict[str, Any]:
    """Return everything the report shows for campaign ``name`` (JSON-ready).

    Raises:
        NotFound: No campaign named ``name`` in this store.
    """
    summary = store.summary(name)
    with store.reading() as reader:
        cid = readers.require_campaign(reader, name)
    accepted = _accepted(store, cid)
    best_so_far: float | None = None
    for entry in summary["rounds"]:
        best = entry["best"]
        if best is not None and (best_so_far is None or best < best_so_far):
            best_so_far = best
        entry["best_so_far"] = best_so_far
        finished = sum(n for d, n in entry["dispositions"].items() if d != "pending")
        entry["acceptance_rate"] = (
            entry["dispositions"].get("accepted", 0) / finished if finished else None
        )
        chosen = accepted.get(entry["index"], {})
        entry["rationale"] = chosen.get("rationale")
        entry["verifier_prediction"] = chosen.get("prediction")
    return {
        **summary,
        "rejections": _rejections(store, cid),
        "approvals": approvals(store, cid, summary),
        "batches": _batches(store, cid),
    }


# -- HTML ------------------------------------------------------------------------------

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:70em;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1.5em}
th,td{border:1px solid #ccc;padding:0.25em 0.5em;text-align:left;vertical-align:top}
th{background:#f3f3f3} img{max-width:100%} .muted{color:#777}
"""


def _text(value: Any) -> str:
    """Return ``value`` as escaped HTML text (numbers to 6 significant digits)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return html.escape(f"{value:.6g}")
    if isinstance(value, str):
        return html.escape(value)
    return html.escape(json.dumps(value, separators=(",", ":"), default=str))


def _table(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    head = "".join(f"<th>{_text(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{_text(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _figure(drawn: dict[str, DrawnFigure], name: str, alt: str) -> str:
    """Return the figure as an embedded PNG, its description in ``data-figure`` (JSON)."""
    if name not in drawn:
        return '<p class="muted">Nothing recorded for this figure.</p>'
    figure = drawn[name]
    encoded = base64.b64encode(figure.png).decode("ascii")
    described = html.escape(json.dumps(figure.description, separators=(",", ":")))
    return (
        f'<figure data-name="{html.escape(name)}" data-figure="{described}">'
        f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{encoded}"></figure>'
    )


def _approvals_html(approvals: Sequence[dict[str, Any]]) -> str:
    if not approvals:
        return '<p class="muted">No approval was requested.</p>'
    settled = _table(REQUEST_COLUMNS, [request_row(a) for a in approvals])
    answers = _table(ANSWER_COLUMNS, [row for a in approvals for row in answer_rows(a)])
    return (
        settled
        + "<p>Candidates are numbered by their # in the form's Proposed batch table. "
        + "Every answer, in order:</p>"
        + answers
    )


_BATCH_COLUMNS = (
    "batch",
    "round",
    "backend",
    "candidates",
    "done",
    "failed",
    "launched",
    "wall (s)",
    "runtime min",
    "median",
    "mean",
    "max",
)


def _batch_row(batch: dict[str, Any]) -> tuple[Any, ...]:
    runtime = batch["runtime"] or {}
    return (
        batch["key"],
        batch["round_index"],
        batch["backend"],
        batch["candidates"],
        batch["done"],
        batch["failed"],
        batch["launched_at"],
        batch["wall_seconds"],
        *(runtime.get(k) for k in ("min", "median", "mean", "max")),
    )


def _percent(rate: float | None) -> str:
    return "-" if rate is None else f"{rate:.1%}"


def render_html(data: dict[str, Any], drawn: dict[str, DrawnFigure]) -> str:
    """Return the report as one HTML document (figures embedded)."""
    c, t = data["campaign"], data["totals"]
    best = data["best_result"]
    status = c["status"] + (f" ({c['error_code']})" if c["error_code"] else "")
    best_line = (
        "no finished task"
        if best is None
        else f"{best['objective']:.6g} in round {best['round_index']}, batch {best['batch']}, "
        f"task {best['task_index']}"
    )
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>Campaign {_text(c['name'])}: report</title><style>{_STYLE}</style></head><body>",
        f"<h1>Campaign {_text(c['name'])}</h1>",
        _table(
            ("status", "site", "seed", "code", "created", "updated"),
            [(status, c["site"], c["seed"], c["code_version"], c["created_at"], c["updated_at"])],
        ),
        f"<p>{_text(count(t['rounds'], 'round'))}, {_text(count(t['gate_calls'], 'gate call'))}, "
        f"{_text(count(t['attempts'], 'attempt'))}; acceptance rate "
        f"{_percent(t['acceptance_rate'])} of gate calls; "
        f"{_text(count(t['fallbacks'], 'fallback'))}. Best result: {_text(best_line)}.</p>",
        '<h2 id="best">Best result per round</h2>',
        _figure(drawn, "best.png", "best result per round"),
        _table(
            (
                "round",
                "status",
                "decision",
                "tasks done",
                "round's best",
                "best so far",
                "verifier predicted",
                "rationale",
            ),
            [
                (
                    r["index"],
                    r["status"],
                    r["decision"],
                    f"{r['done']}/{r['tasks']}",
                    r["best"],
                    r["best_so_far"],
                    r["verifier_prediction"],
                    (r["rationale"] or "")[:_RATIONALE_CHARS] or None,
                )
                for r in data["rounds"]
            ],
        ),
        '<h2 id="acceptance">Acceptance and dispositions per round</h2>',
        _figure(drawn, "dispositions.png", "dispositions and acceptance rate per round"),
        _table(
            ("round", "gate calls", "dispositions", "attempts", "acceptance rate"),
            [
                (
                    r["index"],
                    r["gate_calls"],
                    r["dispositions"],
                    r["attempts"],
                    _percent(r["acceptance_rate"]),
                )
                for r in data["rounds"]
            ],
        ),
        '<h2 id="rejections">Reasons for rejection</h2>',
        _figure(drawn, "rejections.png", "rejections by check"),
        _table(
            ("rank", "rejected by", "reason", "count"),
            [
                (i, e["rejected_by"], e["reason"], e["count"])
                for i, e in enumerate(data["rejections"][:_TOP_REASONS], start=1)
            ],
        ),
        '<h2 id="approvals">Approvals</h2>',
        _approvals_html(data["approvals"]),
        '<h2 id="simulation">Simulation time per batch</h2>',
        _figure(drawn, "simulation.png", "batch wall time and task runtimes"),
        _table(_BATCH_COLUMNS, [_batch_row(b) for b in data["batches"]]),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _write(path: Path, content: bytes) -> None:
    """Write ``content`` to a temporary file beside ``path`` and rename it into place."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(content)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_report(store: ProvenanceStore, name: str, output: str | os.PathLike[str]) -> Path:
    """Write campaign ``name``'s report into folder ``output``; return the HTML file's path.

    Everything is read and drawn before the folder is created, so an unknown
    campaign (:class:`policies.NotFound`) writes nothing.
    """
    data = collect(store, name)
    drawn = draw(data)
    document = render_html(data, drawn).encode("utf-8")
    folder = Path(output)
    private_dir(folder)  # the figures show candidate values
    for file_name in FIGURE_FILES:
        if file_name in drawn:
            _write(folder / file_name, drawn[file_name].png)
        else:  # an older report's figure would no longer match this one
            (folder / file_name).unlink(missing_ok=True)
    target = folder / REPORT_FILE
    _write(target, document)
    return target
