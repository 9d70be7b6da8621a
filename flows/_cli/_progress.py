"""A campaign's progress in the terminal, read from its provenance database.

``unattended run`` and ``submit --follow`` poll the database (read-only) once a
second beside the flow run's state. The database is the source of truth: it is
what the flow records, whichever process runs it. On a terminal the progress is
a live ``rich`` table with a bar per batch; otherwise plain lines, each printed
once, so a log file reads top to bottom.

A batch's results are recorded when it ends; how far a running batch is comes from
the campaign directory's tally (``flows._engine._tally``). The live bars follow it;
in plain mode a *long* batch (still running ``long_after_seconds`` after it was
seen launched, 30 s by default) gets a line ``round 3: 40/128 tasks ended`` each
time another tenth of it ended, or every ``every_seconds`` (60 s) while tasks end;
a short batch stays quiet.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flows._engine._tally import TALLY_FILE, read_tally
from flows._paths import campaign_dir, state_dir_from
from flows._words import either


@dataclass(frozen=True)
class RoundProgress:
    """One round as the provenance shows it right now."""

    index: int
    status: str
    gate_calls: int
    gate: str  # e.g. "accepted", "fallback", "pending", "accepted+fallback"
    attempts: int
    decision: str | None
    tasks: int  # the launched batch's size (0 before launch)
    done: int
    failed: int
    finished: bool  # the batch's results are recorded
    waiting_for: str | None  # the rule of an unanswered approval request
    approvers: tuple[str, ...] = ()  # who may answer it
    answered: str | None = None  # the round's settled approval: "approved by alice"
    best: float | None = None  # the best objective so far, this round included
    # One per relaunch: "5 task(s) interrupted (job 123 ended: timeout); relaunched in job 124".
    interruptions: tuple[str, ...] = ()
    relaunched: int = 0  # candidates relaunched so far (each interruption counted)


def _jobs(jobs: list[str]) -> str:
    unique = sorted(set(jobs), key=lambda j: (len(j), j))
    return ("job " if len(unique) == 1 else "jobs ") + ", ".join(unique)


def interruption_lines(
    batches: list[dict[str, Any]], allocations: list[dict[str, Any]]
) -> list[str]:
    """Say, per interrupted batch of a round, how many tasks were cut, by which job's end,
    and where they run again: ``5 task(s) interrupted (job 123 ended: timeout); relaunched
    in job 124`` (``relaunching in a new allocation`` until the relaunch has run).

    ``batches`` are the round's batches (``round_view``), ``allocations`` the campaign's
    allocation rows (a job's recorded end reason, when the executor has recorded it).
    """
    ended = {str(a["job_id"]): f": {a['end_reason']}" for a in allocations if a["end_reason"]}
    ordered = sorted(batches, key=lambda b: int(b.get("relaunch") or 0))
    lines = []
    for position, batch in enumerate(ordered):
        cut = [r for r in batch["results"] if r["status"] == "interrupted"]
        if not cut:
            continue
        jobs = sorted({str(r["job_id"]) for r in cut if r.get("job_id")})
        how = "; ".join(f"job {j} ended{ended.get(j, '')}" for j in jobs)
        line = f"{len(cut)} task(s) interrupted" + (f" ({how})" if how else "")
        # The relaunch's results (none until it ends): where the cut tasks ran again.
        after = ordered[position + 1]["results"] if position + 1 < len(ordered) else []
        again = [str(r["job_id"]) for r in after if r.get("job_id")]
        if again:
            line += f"; relaunched in {_jobs(again)}"
        elif after:
            line += "; relaunched"
        else:  # one line while it waits for an allocation and runs, one once it ran
            line += "; relaunching in a new allocation"
        lines.append(line)
    return lines


def read_progress(store: Any, campaign: str) -> list[RoundProgress]:
    """Return every round's progress from a (read-only) provenance store."""
    summary = store.summary(campaign)
    pending = {
        int(a["round_index"]): (a["rule"] or "policy", tuple(a["approvers_allowed"] or ()))
        for a in summary["approvals"]
        if a["decision"] is None
    }
    answered = {}
    for a in summary["approvals"]:  # in request order: a round's last settled one stays
        if a["decision"] is not None:
            who = f" by {a['decided_by']}" if a["decided_by"] else ""
            answered[int(a["round_index"])] = f"{a['decision']}{who}"
    rounds = []
    best: float | None = None
    allocations: list[dict[str, Any]] | None = None
    for entry in summary["rounds"]:
        index = int(entry["index"])
        recorded = int(entry["tasks"])
        launched = recorded
        cut = int(entry.get("interruptions") or 0)
        interruptions: list[str] = []
        if cut or (not recorded and entry["status"] != "completed" and entry["decision"]):
            # Results are recorded when a batch ends; its size is known at launch. A batch
            # whose allocation ended under it has results only for the tasks that ended.
            batches = store.round_view(campaign, index)["batches"]
            launched = sum(
                len(batch["candidates"] or []) for batch in batches if not batch.get("relaunch")
            )
            if cut:
                if allocations is None:
                    allocations = store.allocations(campaign)
                interruptions = interruption_lines(batches, allocations)
        if entry.get("best") is not None:
            best = float(entry["best"]) if best is None else min(best, float(entry["best"]))
        dispositions = entry["dispositions"]
        rounds.append(
            RoundProgress(
                index=index,
                status=str(entry["status"]),
                gate_calls=int(entry["gate_calls"]),
                gate="+".join(sorted(dispositions)) if dispositions else "",
                attempts=int(entry["attempts"]),
                decision=entry["decision"],
                tasks=launched,
                done=int(entry["done"]),
                failed=recorded - int(entry["done"]),
                # Every candidate has its final result (an interrupted one's comes from
                # its relaunch), or the round is over (relaunches gave up).
                finished=recorded > 0 and (recorded >= launched or entry["status"] != "running"),
                waiting_for=pending[index][0] if index in pending else None,
                approvers=pending[index][1] if index in pending else (),
                answered=answered.get(index),
                best=best,
                interruptions=tuple(interruptions),
                relaunched=cut,
            )
        )
    return rounds


def read_queue(store: Any, campaign: str) -> str:
    """Return ``waiting in queue: job 12 PENDING (Resources)`` while the allocation waits.

    Read from the campaign's allocation rows (the executor records each change of
    its jobs); '' when the latest request's jobs are not pending, or none exists.
    """
    rows = store.allocations(campaign)
    if not rows:
        return ""
    latest = max(int(row["request"]) for row in rows)
    waiting = []
    for row in rows:
        if int(row["request"]) == latest and row["state"] == "PENDING":
            reason = row["reason"]
            why = f" ({reason})" if reason and reason != "None" else ""
            waiting.append(f"job {row['job_id']} PENDING{why}")
    return "waiting in queue: " + ", ".join(waiting) if waiting else ""


def progress_lines(round_: RoundProgress) -> list[str]:
    """Return the plain lines that describe ``round_`` so far (each printed once)."""
    head = f"round {round_.index}:"
    lines = [f"{head} started"]
    if round_.gate and "pending" not in round_.gate:
        lines.append(f"{head} gate {round_.gate} after {round_.attempts} attempt(s)")
    # A suspend is said by the waiting line, then by who answered: not as "suspend: pending".
    if round_.decision and not round_.decision.startswith("suspend"):
        lines.append(f"{head} policy {round_.decision}")
    if round_.waiting_for:
        lines.append(f"{head} {waiting_words(round_)} (rule {round_.waiting_for})")
    if round_.answered:
        lines.append(f"{head} approval {round_.answered}")
    if round_.tasks:
        lines.append(f"{head} batch of {round_.tasks} task(s) launched")
    lines += [f"{head} {line}" for line in round_.interruptions]
    if round_.finished:
        lines.append(f"{head} batch finished: {round_.done} done, {round_.failed} failed")
    if round_.status == "completed":
        best = f"; best so far {round_.best:.6g}" if round_.best is not None else ""
        lines.append(f"{head} completed{best}")
    return lines


def waiting_words(round_: RoundProgress) -> str:
    """Return ``waiting for approval by alice or bob`` (who may answer, when known)."""
    names = list(round_.approvers)
    return f"waiting for approval by {either(names)}" if names else "waiting for approval"


class CampaignProgress:
    """Render a campaign's progress: a live ``rich`` table, or plain lines (not a TTY)."""

    def __init__(
        self,
        *,
        live: bool,
        stream: Any = None,
        tally: Path | None = None,
        long_after_seconds: float = 30.0,
        every_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream or sys.stdout
        self.live = live
        self.rounds: list[RoundProgress] = []
        self.queue = ""
        self.tally = tally  # the campaign directory's tally file (found by ``poll``)
        self.long_after_seconds = long_after_seconds
        self.every_seconds = every_seconds
        self.clock = clock
        self._printed: set[str] = set()
        self._store: Any = None
        self._campaign: str | None = None
        self._display: Any = None
        self._ended: dict[int, tuple[int, int]] = {}  # round -> (ended, failed) per the tally
        self._seen: dict[int, float] = {}  # round -> when its batch was first seen running
        self._said: dict[int, tuple[int, float]] = {}  # round -> (ended, when) last printed

    def __enter__(self) -> CampaignProgress:
        if self.live:
            from rich.console import Console
            from rich.live import Live

            console = Console(file=self.stream)
            self._display = Live(self._render(), console=console, refresh_per_second=4)
            self._display.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._display is not None:
            self._display.__exit__(None, None, None)
            self._display = None
        if self._store is not None:
            self._store.close()
            self._store = None

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Stop redrawing while plain text goes to the terminal."""
        if self._display is None:
            yield
            return
        self._display.stop()
        try:
            yield
        finally:
            self._display.start()

    def say(self, line: str) -> None:
        """Print a line above the live table (or on its own)."""
        if self._display is not None:
            self._display.console.print(line, markup=False, highlight=False)
        else:
            print(line, file=self.stream, flush=True)

    def poll(self, flow_run: Any) -> None:
        """Read the provenance again and show what changed; quiet until the database exists."""
        if self.tally is None:
            try:
                self.tally = tally_path(flow_run)
            except Exception:  # noqa: BLE001  # no tally: the records alone are shown
                self.tally = None
        try:
            if self._store is None:
                self._store, self._campaign = open_progress_store(flow_run)
            campaign = self._campaign or ""
            self.update(
                read_progress(self._store, campaign), queue=read_queue(self._store, campaign)
            )
            if getattr(self._store, "snapshot", False):
                # Opened while no writer had it (a run not started yet, or between a
                # suspend and its resume): a frozen snapshot. Open it again next time.
                self._store.close()
                self._store = None
        except Exception:  # noqa: BLE001  # progress is best effort; the run state is what counts
            return

    def update(self, rounds: list[RoundProgress], *, queue: str = "") -> None:
        """Show ``rounds`` (and the queue line): redraw the table, or print new lines."""
        self.rounds = rounds
        changed_queue = queue != self.queue
        self.queue = queue
        running = self._read_tally(rounds)
        if self._display is not None:
            self._display.update(self._render())
            return
        if queue and changed_queue:
            # Printed each time it changes (a job waiting again later is news again).
            print(queue, file=self.stream, flush=True)
        for round_ in rounds:
            for line in progress_lines(round_):
                if line not in self._printed:
                    self._printed.add(line)
                    print(line, file=self.stream, flush=True)
        if running is not None:
            self._say_how_far(running)

    def _read_tally(self, rounds: list[RoundProgress]) -> RoundProgress | None:
        """Return the round whose batch is running, with what its tally says ended."""
        running = next((r for r in reversed(rounds) if r.tasks and not r.finished), None)
        if running is None or running.status != "running" or self.tally is None:
            return None
        self._seen.setdefault(running.index, self.clock())
        counted = read_tally(self.tally)
        if counted is not None and counted["round"] == running.index:
            self._ended[running.index] = (counted["ended"], counted["failed"])
        return running

    def _say_how_far(self, running: RoundProgress) -> None:
        """Print a long batch's ``N/M tasks ended`` line: each tenth, or every so often."""
        now = self.clock()
        if now - self._seen[running.index] < self.long_after_seconds:
            return  # a short batch stays quiet
        ended, failed = self._ended.get(running.index, (0, 0))
        said, when = self._said.get(running.index, (0, self._seen[running.index]))
        if ended <= said:
            return
        tenth = max(1, math.ceil(running.tasks / 10))
        if ended // tenth > said // tenth or now - when >= self.every_seconds:
            self._said[running.index] = (ended, now)
            cut = f" ({failed} failed)" if failed else ""
            line = f"round {running.index}: {ended}/{running.tasks} tasks ended{cut}"
            print(line, file=self.stream, flush=True)

    def _render(self) -> Any:
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        table = Table(box=None, pad_edge=False)
        for column in ("round", "gate", "attempts", "policy", "batch", "tasks", "best so far"):
            table.add_column(column)
        for r in self.rounds:
            # A running batch's bar follows its tally; its records arrive when it ends.
            ended = r.done + r.failed if r.finished else self._ended.get(r.index, (0, 0))[0]
            bar = ProgressBar(total=r.tasks or 1, completed=ended, width=24)
            policy = waiting_words(r) if r.waiting_for else (r.decision or "")
            if r.answered and not r.waiting_for:
                policy = f"{policy} ({r.answered})" if policy else r.answered
            tasks = (
                f"{r.done} done, {r.failed} failed"
                if r.finished
                else (f"{r.tasks} running" if r.tasks else "")
            )
            if r.relaunched:
                tasks += f", {r.relaunched} interrupted and relaunched"
            best = f"{r.best:.6g}" if r.best is not None else ""
            table.add_row(
                str(r.index), r.gate, str(r.attempts), policy, bar if r.tasks else "", tasks, best
            )
        done = sum(r.done for r in self.rounds)
        failed = sum(r.failed for r in self.rounds)
        totals = f"tasks: {done} done, {failed} failed"
        return Group(table, totals, self.queue) if self.queue else Group(table, totals)


def tally_path(flow_run: Any) -> Path:
    """Return the run's campaign directory's tally file (``flows._engine._tally``)."""
    from flows._engine._registration import registered_parameters
    from flows._spec import load_campaign

    params = registered_parameters(flow_run.deployment_id, os.environ)
    if params is None:
        raise KeyError(str(flow_run.deployment_id))
    name = load_campaign(params["spec_path"]).spec.name
    return campaign_dir(state_dir_from(params.get("state_dir"), os.environ), name) / TALLY_FILE


def open_progress_store(flow_run: Any) -> tuple[Any, str]:
    """Open the run's provenance database read-only; return it with the campaign's name."""
    from flows._engine._registration import registered_parameters
    from flows._provenance._sqlite import open_read_only
    from flows._spec import load_campaign
    from tasks import load_site

    # The owner's registration, never the run's own parameters (anyone with the secret
    # can write those): a run that is not one of ours has no progress to show here.
    params = registered_parameters(flow_run.deployment_id, os.environ)
    if params is None:
        raise KeyError(str(flow_run.deployment_id))
    loaded = load_campaign(params["spec_path"])
    site = load_site(params.get("site") or loaded.spec.site, env=os.environ)
    home = state_dir_from(params.get("state_dir"), os.environ)
    location = (
        site.provenance_url.get_secret_value()
        if site.provenance_url is not None
        else campaign_dir(home, loaded.spec.name)
    )
    return open_read_only(location), loaded.spec.name
