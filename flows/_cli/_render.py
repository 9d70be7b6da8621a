"""Print what ``unattended inspect`` reads: rich tables on a terminal, plain text when piped.

Every cell is built as :class:`rich.text.Text`, so values recorded from a
planner are shown literally and never interpreted as markup.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from flows._cli._cells import cell, full, short
from flows._cli._records import open_read_only
from flows._words import count


class _PipedConsole(Console):
    """A console that leaves a closed pipe (``| head``) to ``flows._cli.main``, like print."""

    def on_broken_pipe(self) -> None:
        # rich would exit with status 1 here; every other command ends a closed pipe with 0.
        self.quiet = True
        raise BrokenPipeError


# Piped with no COLUMNS: a 100-column terminal (--wide: 200, long values kept whole).
_PIPED_WIDTH = 100
_WIDE_WIDTH = 200


def _console(*, wide: bool) -> Console:
    columns = os.environ.get("COLUMNS")
    if wide:
        width = None if sys.stdout.isatty() else int(columns or _WIDE_WIDTH)
    else:
        width = int(columns) if columns else (None if sys.stdout.isatty() else _PIPED_WIDTH)
    return _PipedConsole(width=width, highlight=False)


def show(data: Any, printer: Callable[..., None], *, as_json: bool, wide: bool = False) -> None:
    """Print ``data`` as JSON, or through ``printer`` (summarised cells unless ``wide``)."""
    if as_json:
        json.dump(data, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        return
    printer(_console(wide=wide), data, wide=wide)


def _when(moment: str | None) -> str:
    # Text output shows seconds, in UTC; --json keeps the full ISO timestamps.
    if not moment:
        return "-"
    return moment[:19].replace("T", " ") + "Z"


def _table(
    title: str | None,
    columns: Iterable[str],
    rows: Iterable[Iterable[Any]],
    *,
    wide: bool = True,
) -> Table:
    # Narrow: no vertical rules and one space between columns (a 100-column terminal).
    table = (
        Table(title=title, title_justify="left", show_lines=False)
        if wide
        else Table(
            title=title,
            title_justify="left",
            box=box.SIMPLE_HEAD,
            pad_edge=False,
            collapse_padding=True,
        )
    )
    for column in columns:
        # A header is never folded ("dispositio / ns"): its values wrap instead.
        table.add_column(column, overflow="fold", min_width=None if wide else len(column))
    for row in rows:
        table.add_row(*(cell(v, wide=wide) for v in row))
    return table


def _narrowed(
    columns: Sequence[str], rows: list[list[Any]], wide_only: Iterable[str], *, wide: bool
) -> tuple[list[str], list[list[Any]]]:
    """Drop the ``wide_only`` columns unless ``wide`` (``--wide`` shows every column)."""
    if wide:
        return list(columns), rows
    keep = [i for i, c in enumerate(columns) if c not in set(wide_only)]
    return [columns[i] for i in keep], [[row[i] for i in keep] for row in rows]


def list_campaigns(locations: list[str]) -> list[dict[str, Any]]:
    """Return every campaign in every database at ``locations``."""
    found: list[dict[str, Any]] = []
    for location in locations:
        with open_read_only(location) as store:
            for campaign in store.campaigns():
                found.append({**campaign, "database": store.location.label})
    return found


def shown_status(status: str, error_code: str | None) -> str:
    """Return the status a person reads: a campaign stopped by ``cancel`` is ``cancelled``.

    The database keeps it as ``blocked`` with the code ``cancelled`` (its status
    column has no ``cancelled``); ``--json`` shows both columns as stored.
    """
    return "cancelled" if status == "blocked" and error_code == "cancelled" else status


def print_campaigns(
    console: Console, campaigns: list[dict[str, Any]], *, wide: bool = False
) -> None:
    """Print one line per campaign."""
    columns = ("name", "status", "error_code", "site", "rounds", "updated", "database")
    rows = [
        [
            c["name"],
            shown_status(c["status"], c["error_code"]),
            c["error_code"],
            c["site"],
            c["rounds"],
            _when(c["updated_at"]),
            c["database"],
        ]
        for c in campaigns
    ]
    console.print(_table("Campaigns", columns, rows, wide=wide))


def print_summary(console: Console, summary: dict[str, Any], *, wide: bool = False) -> None:
    """Print a campaign summary: header, totals, rounds, approvals, best result.

    "round's best" is the best value of a round's own tasks; "best so far" the
    campaign's best up to and including that round (what ``run``'s live view shows).
    """
    c, t = summary["campaign"], summary["totals"]
    status = shown_status(c["status"], c["error_code"])
    if c["error_code"] and status != c["error_code"]:
        status += f" ({c['error_code']})"
    console.print(Text(f"Campaign {c['name']}: {status}", style="bold"))
    console.print(
        Text(
            f"site {c['site']}  seed {c['seed']}  code {c['code_version']}  "
            f"created {_when(c['created_at'])}  updated {_when(c['updated_at'])}"
        )
    )
    rate = "-" if t["acceptance_rate"] is None else f"{t['acceptance_rate']:.1%}"
    console.print(
        Text(
            f"{count(t['rounds'], 'round')}, {count(t['gate_calls'], 'gate call')}, "
            f"{count(t['attempts'], 'attempt')}; acceptance rate {rate} of gate calls; "
            f"{count(t['fallbacks'], 'fallback')}; "
            f"dispositions {short(t['dispositions'], 200)}"
        )
    )
    columns: tuple[str, ...] = (
        "round",
        "status",
        "gate calls",
        "gate",
        "attempts",
        "decision",
        "tasks done",
        "round's best",
        "best so far",
    )
    rows = []
    so_far: float | None = None
    for r in summary["rounds"]:
        if r["best"] is not None:
            so_far = r["best"] if so_far is None else min(so_far, r["best"])
        rows.append(
            [
                r["index"],
                r["status"],
                r["gate_calls"],
                r["dispositions"] if wide else _gate(r["dispositions"]),
                r["attempts"],
                r["decision"],
                f"{r['done']}/{r['tasks']}",
                r["best"],
                so_far,
            ]
        )
    console.print(_table("Rounds", columns, rows, wide=wide))
    if summary["approvals"]:
        columns = ("round", "key", "rule", "decision", "decided_by", "decided_at")
        rows = [
            [
                a["round_index"],
                a["key"],
                a["rule"],
                a["decision"],
                a["decided_by"],
                _when(a["decided_at"]),
            ]
            for a in summary["approvals"]
        ]
        console.print(_table("Approvals", columns, rows, wide=wide))
    best = summary["best_result"]
    if best is None:
        console.print(Text("Best result: none (no finished task with a numeric value)"))
    else:
        console.print(
            Text(
                f"Best result: {best['objective']:.6g} in round {best['round_index']}, batch "
                f"{best['batch']}, task {best['task_index']} ({best['key']}); candidate "
                f"{cell(best['candidate'], wide=wide)}"
            )
        )


def _gate(dispositions: dict[str, int]) -> str:
    """Return what a round's gate calls came to: ``accepted``, ``accepted 2, fallback``."""
    said = [k if n == 1 else f"{k} {n}" for k, n in sorted(dispositions.items())]
    return ", ".join(said) or "-"


def _verdicts(verdicts: list[dict[str, Any]], *, wide: bool = True) -> str:
    if not wide:  # the reason column says why: here, which checks failed
        failed = [str(v["check"]) for v in verdicts if not v["passed"]]
        passed = len(verdicts) - len(failed)
        said = [f"{', '.join(failed)} failed"] * bool(failed) + [f"{passed} passed"] * bool(passed)
        return "; ".join(said) or "-"
    return "; ".join(
        f"{v['check']}: {'pass' if v['passed'] else 'FAIL ' + str(v['reason'])}" for v in verdicts
    )


def _attempt_result(attempt: dict[str, Any]) -> str:
    if attempt.get("failed_by") is not None:
        return f"failed in {attempt['failed_by']}"
    if attempt["rejected_by"] is not None:
        return f"rejected by {attempt['rejected_by']}"
    return "accepted"


def _disposition(call: dict[str, Any]) -> str:
    # A call a failing producer or check stopped is "failed" (recorded "pending" before
    # revision 0010): say which one failed.
    failed = [a["failed_by"] for a in call["attempts"] if a.get("failed_by") is not None]
    if call["disposition"] in {"pending", "failed"} and failed:
        return f"failed ({failed[-1]} failed)"
    return str(call["disposition"])


def _failure_lines(attempt: dict[str, Any]) -> Text:
    """Say how a failing check's task ended: status, code, exit status, job, stderr tail."""
    verdict: dict[str, Any] = next(
        (v for v in attempt["verdicts"] if v["check"] == attempt["failed_by"] and not v["passed"]),
        {},
    )
    details = verdict.get("details") or {}
    line = f"  Attempt {attempt['number']} failed in {attempt['failed_by']}: {attempt['reason']}"
    if details.get("task_key") or details.get("status"):  # a check's task (the verifier's)
        line += (
            f"\n    task {details.get('task_key') or '-'}: status {details.get('status') or '-'}, "
            f"error {details.get('error_code') or '-'}, exit code "
            f"{full(details.get('exit_code'))}, job {details.get('job_id') or '-'}"
        )
    elif details:  # what the producer's error said (a provider's HTTP status, say)
        line += "\n    details: " + ", ".join(f"{k} {full(v)}" for k, v in details.items())
    stderr = str(details.get("stderr_tail") or "").rstrip("\n")
    if stderr:
        line += "\n    stderr tail:\n" + "\n".join(f"      {s}" for s in stderr.splitlines())
    return Text(line)


def _node_spread(results: list[dict[str, Any]]) -> str:
    """Return how a batch spread over the nodes: ``n1 3 done; n2 2 done, 1 interrupted``."""
    counts: dict[str, Counter[str]] = {}
    for r in results:
        if r["host"]:
            counts.setdefault(str(r["host"]), Counter())[str(r["status"])] += 1
    return "; ".join(
        f"{host} " + ", ".join(f"{n} {status}" for status, n in sorted(statuses.items()))
        for host, statuses in sorted(counts.items())
    )


def print_round(console: Console, view: dict[str, Any], *, wide: bool = False) -> None:
    """Print one round: every record, long values summarised unless ``wide``."""
    r = view["round"]
    console.print(
        Text(
            f"Campaign {view['campaign']}, round {r['round_index']}: {r['status']}  "
            f"(started {_when(r['started_at'])}, finished {_when(r['finished_at'])})",
            style="bold",
        )
    )
    for call in view["gate_calls"]:
        console.print(
            Text(
                f"\nGate call {call['call_index']} ({call['name']}): {_disposition(call)} "
                f"after {call['attempts_used']} of {call['budget']} attempts\n"
                f"  fallback sha {call['fallback_hash'] or '-'} computed "
                f"{_when(call['fallback_computed_at'])}: "
                f"{cell(call['fallback_value'], wide=wide)}"
            )
        )
        columns: tuple[str, ...] = (
            "#",
            "result",
            "reason",
            "value",
            "verdicts",
            "scores",
            "seconds",
            "trace",
        )
        rows = [
            [
                a["number"],
                _attempt_result(a),
                a["reason"],
                a["value"],
                _verdicts(a["verdicts"], wide=wide),
                a["scores"] or None,
                a["duration"],
                a["trace_id"],
            ]
            for a in call["attempts"]
        ]
        shown, rows = _narrowed(columns, rows, ("scores", "trace"), wide=wide)
        console.print(_table("Attempts", shown, rows, wide=wide))
        for a in call["attempts"]:
            if a.get("failed_by") is not None:
                console.print(_failure_lines(a))
    if view["decisions"]:
        columns = (
            "seq",
            "outcome",
            "code",
            "reason",
            "rules_fired",
            "severities",
            "explanation",
        )
        rows = [[d[k] for k in columns] for d in view["decisions"]]
        shown, rows = _narrowed(columns, rows, ("severities", "explanation"), wide=wide)
        console.print(_table("Policy decisions", shown, rows, wide=wide))
    for a in view["approvals"]:
        console.print(
            Text(
                f"\nApproval {a['key']} (rule {a['rule']}, "
                f"allowed {', '.join(a['approvers_allowed'])}"
                f", run {a['flow_run_id']}) requested {_when(a['requested_at'])}: "
                f"{a['decision'] or 'pending'} by {a['decided_by'] or '-'} at "
                f"{_when(a['decided_at'])}; comment {a['comment'] or '-'}; overrides "
                f"{cell(a['overrides'], wide=wide)}"
            )
        )
        columns = ("decided_by", "decision", "allowed", "settled", "comment", "recorded")
        rows = [
            [
                e["decided_by"],
                e["decision"],
                e["allowed"],
                e["settled"],
                e["comment"],
                _when(e["recorded_at"]),
            ]
            for e in a["events"]
        ]
        console.print(_table("Approval events (every decision attempt)", columns, rows, wide=wide))
    if view.get("candidates"):
        columns = ("call", "source", "#", "candidate", "fate", "by", "reason")
        rows = [
            [
                c["call_index"],
                c["source"],
                c["candidate_index"],
                c["candidate"],
                c["fate"],
                (c["rule"] and f"rule {c['rule']}") or c["actor"],
                c["reason"],
            ]
            for c in view["candidates"]
        ]
        console.print(_table("Candidates", columns, rows, wide=wide))
    for b in view["batches"]:
        console.print(
            Text(
                f"\nBatch {b['key']} on {b['backend']}: {b['status']}, "
                f"{len(b['candidates'])} candidates, launched {_when(b['launched_at'])}, finished "
                f"{_when(b['finished_at'])}"
            )
        )
        columns = (
            "#",
            "key",
            "status",
            "value",
            "candidate",
            "runtime",
            "host",
            "job",
            "window (UTC)",
            "exit",
            "tries",
            "error",
            "stderr_tail",
        )
        rows = [
            [
                r["index"],
                r["key"],
                r["status"],
                r["value"],
                r["candidate"],
                r["runtime"],
                r["host"],
                r["job_id"],
                _window(r["allocation_start"], r["allocation_end"]),
                r["exit_code"],
                r["attempts"],
                r["error_code"],
                r["stderr_tail"] or None,
            ]
            for r in b["results"]
        ]
        shown, rows = _narrowed(columns, rows, ("key", "window (UTC)", "stderr_tail"), wide=wide)
        console.print(_table("Task results", shown, rows, wide=wide))
        if not wide:  # the column left out: a task that did not finish well says why here
            for r in b["results"]:
                tail = str(r["stderr_tail"] or "").rstrip("\n")
                if tail and r["status"] != "done":
                    lines = "\n".join(f"    {line}" for line in tail.splitlines())
                    console.print(
                        Text(f"  task {r['index']} ({r['status']}) stderr tail:\n{lines}")
                    )
        spread = _node_spread(b["results"])
        if spread:
            console.print(Text(f"Nodes: {spread}"))


def _window(start: str | None, end: str | None) -> str | None:
    """Return a job's window as ``start .. planned end`` (UTC), or None without a job."""
    if start is None and end is None:
        return None
    return f"{_when(start)} .. {_when(end)}"
