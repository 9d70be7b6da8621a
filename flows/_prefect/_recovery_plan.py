"""What the runner's watchdog does for one campaign: a plan decided from what it sees, no I/O.

``plan(runs, record, now, settings)`` takes the campaign's runs as Prefect shows them
(``SeenRun``) and its provenance (``Record``: the lease, the campaign's status, each
run's recorded ending, the continuations so far) and returns the ``Action``s due, each
with the moment it is due (``at``). ``Watchdog._sweep_one`` carries out those due now;
``recovery_note`` (what ``unattended status`` prints) describes the same list, so the
two never disagree. Without the record (``None``) the plan answers from Prefect's
states alone when it can, else asks for it (``ReadRecord``): a campaign whose runs a
process of this runner executes costs the sweep no database.

**Alive** is one rule (``alive_until``). A run is alive while a process of this runner
executes it, or while it holds the campaign's lease (unexpired, its process not known
gone); a run without the lease is given one lease TTL from when it entered its state
(a live run takes the lease as it starts), or from when it recorded its ending (it
then gives the lease back and Prefect records its end a moment later).

* A Running or Pending run that is no longer alive and recorded no ending is an
  **orphan**: marked Crashed (``CrashOrphan``). One that recorded its ending finished:
  it is never marked Crashed, whatever the lease says; its Prefect state is set from
  the ending (``Settle``) if its process died before Prefect heard of the end.
* A Cancelling run nobody is left to stop (not alive, Cancelling for a lease TTL) is
  ended Cancelled (``EndCancel``): a person's cancel, recorded as such.
* With no active run left, the newest of the campaign's own runs decides. Its recorded
  ending says it finished (nothing to do), or that its storage failed (continue). With
  none recorded: Crashed, Failed (storage, or set Failed through the API) and Completed
  (set Completed through the API while the campaign waits or runs) are continued
  (``Continue``, counted toward the cap; ``StopExhausted`` at the cap); Cancelled by a
  runner's shutdown is continued, uncounted; any other Cancelled is a person's cancel
  (``RecordCancel``). Only a campaign the provenance says is still going (running,
  awaiting approval, or failed on storage) is continued or recorded cancelled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Final, TypeAlias

from flows._engine._fencing import RecoverySettings
from flows._provenance._rows import RunEnding

# Prefect's state types, as its API spells them.
ACTIVE: Final = frozenset({"SCHEDULED", "PENDING", "RUNNING", "PAUSED", "CANCELLING"})
JUDGED: Final = frozenset({"RUNNING", "PENDING"})
STILL_GOING: Final = frozenset({"running", "awaiting_approval"})
TRANSIENT_CODE: Final = "storage_unavailable"
EXHAUSTED_CODE: Final = "continuations_exhausted"
CANCELLED_CODE: Final = "cancelled"
_EPOCH: Final = datetime.min.replace(tzinfo=UTC)
# Automatic continuations after a crash or a transient failure, in a row without
# progress, per campaign (counted in its provenance, whatever runner made them): the
# default of the setting ``max_continuations``.
MAX_CONTINUATIONS: Final = RecoverySettings.max_continuations


@dataclass(frozen=True)
class SeenRun:
    """One flow run of the campaign's deployment, as Prefect and this runner see it.

    Args:
        id: The flow run id.
        state: Prefect's state type (``RUNNING``, ``COMPLETED``, ...).
        since: When the run entered that state.
        created: When the run was created (the newest decides the campaign's fate).
        ours: Its parameters are the owner's registration (never continued otherwise).
        alive_here: A process of this runner executes it.
        shutdown: Prefect's runner cancelled it as the runner shut down.
    """

    id: str
    state: str
    since: datetime
    created: datetime
    ours: bool = True
    alive_here: bool = False
    shutdown: bool = False


@dataclass(frozen=True)
class SeenLease:
    """The campaign's lease as the sweep read it (``holder_gone`` looked up on this host)."""

    owner: str
    pid: int
    released: bool
    expires_at: datetime
    holder_gone: bool


@dataclass(frozen=True)
class Continuations:
    """The continuations a campaign had in a row without progress, from its provenance.

    ``count`` counts the ``continued`` events marked ``counted`` that were made at the
    campaign's current progress (``progress``: rounds and task results) since the last
    ``continuations_exhausted``; ``last_at`` is when the newest was recorded.
    """

    count: int = 0
    last_at: datetime | None = None
    progress: tuple[int, int] = (0, 0)
    cap: int = MAX_CONTINUATIONS

    @property
    def exhausted(self) -> bool:
        """True when the cap is reached: the next continuation is refused."""
        return self.count >= self.cap

    def not_before(self, settings: RecoverySettings) -> datetime | None:
        """Return when the next continuation may start (the doubling pause), or None: now."""
        if self.count == 0 or self.last_at is None:
            return None
        pause = settings.watchdog_seconds * 2 ** (self.count - 1)
        return self.last_at + timedelta(seconds=pause)


@dataclass(frozen=True)
class Record:
    """What the campaign's provenance says, for the plan.

    Args:
        status: The campaign's recorded status (None: no such campaign recorded).
        code: The stable code beside it.
        lease: The campaign's lease (None: never taken).
        endings: Each run's recorded ending, by flow run id.
        cancel_asked: The runs ``unattended cancel`` asked to cancel.
        tally: Continuations so far (the cap and the pause).
    """

    status: str | None
    code: str | None = None
    lease: SeenLease | None = None
    endings: Mapping[str, RunEnding] = field(default_factory=dict)
    cancel_asked: frozenset[str] = frozenset()
    tally: Continuations = Continuations()

    @property
    def resumable(self) -> bool:
        """True when the campaign is still going, or stopped only by its storage."""
        return self.status in STILL_GOING or (
            self.status == "failed" and self.code == TRANSIENT_CODE
        )


@dataclass(frozen=True)
class ReadRecord:
    """The plan needs the campaign's provenance to decide (asked with ``record=None``)."""

    at: datetime = _EPOCH


@dataclass(frozen=True)
class CrashOrphan:
    """Mark a Running/Pending run Crashed: nothing runs it and it never said how it ended."""

    run_id: str
    why: str
    at: datetime


@dataclass(frozen=True)
class Settle:
    """Set a finished run's Prefect state from its recorded ending (its process died first)."""

    run_id: str
    ending: RunEnding
    at: datetime


@dataclass(frozen=True)
class EndCancel:
    """End a Cancelling run Cancelled: nobody is left to stop it."""

    run_id: str
    why: str
    at: datetime


@dataclass(frozen=True)
class RecordCancel:
    """Record a person's cancel of the campaign's newest run (``blocked``, ``cancelled``)."""

    run_id: str
    at: datetime


@dataclass(frozen=True)
class Continue:
    """Start a new run of the campaign after ``after`` ended without finishing it."""

    after: str
    why: str
    counted: bool
    at: datetime
    number: int = 0  # which continuation in a row without progress (counted ones only)
    cap: int = MAX_CONTINUATIONS  # of how many allowed


@dataclass(frozen=True)
class StopExhausted:
    """Record the campaign failed (``continuations_exhausted``) instead of continuing it."""

    after: str
    why: str
    at: datetime
    count: int = 0  # the continuations made in a row without progress


@dataclass(frozen=True)
class Leave:
    """Leave the campaign as it is after ``after`` ended: a person's cancel, or a stop.

    Nothing is done; the watchdog says so once a run (its word that it judged the run).
    """

    after: str
    cancelled: bool
    status: str | None
    code: str | None
    at: datetime


Action: TypeAlias = (
    ReadRecord | CrashOrphan | Settle | EndCancel | RecordCancel | Continue | StopExhausted | Leave
)


class _UnreadError(Exception):
    """The plan reached a question only the provenance answers."""


def _need(record: Record | None) -> Record:
    if record is None:
        raise _UnreadError
    return record


def _age(moment: datetime, now: datetime) -> float:
    return (now - moment).total_seconds()


def alive_until(
    run: SeenRun, record: Record | None, now: datetime, settings: RecoverySettings
) -> tuple[datetime | None, str]:
    """Return until when ``run`` counts as alive (None: as far as one can see), and why not.

    The one definition of "alive" (see the module doc). The reason is for a moment
    already past: what the run is, once it no longer counts as alive.
    """
    if run.alive_here:
        return None, ""
    found = _need(record)
    lease = found.lease
    if lease is not None and lease.owner == run.id and not lease.released:
        if lease.holder_gone:
            return now, f"its process (pid {lease.pid}) is gone"
        if lease.expires_at <= now:
            return lease.expires_at, f"lease expired {_age(lease.expires_at, now):.0f} s ago"
        return None, ""  # renewed by the run: no deadline to speak of
    ending = found.endings.get(run.id)
    start = ending.recorded_at if ending is not None else run.since
    until = start + timedelta(seconds=settings.lease_ttl_seconds)
    why = (
        f"{run.state.lower()} for {_age(run.since, now):.0f} s without holding the campaign's lease"
    )
    return until, why


def _judge(
    run: SeenRun, record: Record | None, now: datetime, settings: RecoverySettings
) -> CrashOrphan | Settle | EndCancel | None:
    """Return what to do about one run that may have nobody behind it, or None."""
    if run.state not in JUDGED and run.state != "CANCELLING":
        return None
    until, why = alive_until(run, record, now, settings)
    if until is None:
        return None
    if run.state == "CANCELLING":
        # A runner that killed the run's process sets Cancelled itself a few seconds
        # later (3.5 s measured): its ending is the one to keep, for a lease TTL.
        cancelled_by = run.since + timedelta(seconds=settings.lease_ttl_seconds)
        return EndCancel(run.id, why, max(until, cancelled_by))
    ending = _need(record).endings.get(run.id)
    if ending is not None:
        return Settle(run.id, ending, until)
    return CrashOrphan(run.id, why, until)


def _after(run: SeenRun, action: CrashOrphan | Settle | EndCancel) -> SeenRun:
    """Return the run as it is once ``action`` is done (for the rest of the plan)."""
    match action:
        case CrashOrphan():
            state = "CRASHED"
        case EndCancel():
            state = "CANCELLED"
        case Settle(ending=ending):
            state = "COMPLETED" if ending.status == "completed" else "FAILED"
    return SeenRun(run.id, state, action.at, run.created, run.ours, False, False)


def continuation_reason(run: SeenRun, ending: RunEnding | None) -> tuple[str, bool] | None:
    """Return why an ended run's campaign is continued and whether that counts, or None.

    None for a run that finished (its ending is recorded), one still active, and a
    person's cancel (``RecordCancel``).
    """
    if ending is not None:
        if ending.code == TRANSIENT_CODE:
            return "its run failed on storage (disk full, read-only or locked)", True
        return None
    match run.state:
        case "CRASHED":
            return "its run crashed", True
        case "CANCELLED" if run.shutdown:
            return "its run was cancelled by a runner's shutdown", False
        case "FAILED":
            return (
                "its run failed without recording how it ended (its storage failed, "
                "or it was set Failed through the API)",
                True,
            )
        case "COMPLETED":
            return (
                "its run was set Completed through the API before the campaign finished",
                True,
            )
    return None


def _person_cancelled(run: SeenRun, record: Record) -> bool:
    """A Cancelled run a person stopped: asked by ``cancel``, or neither a runner's
    shutdown nor a run that recorded another ending (fenced out, an approval rejected)."""
    if run.state != "CANCELLED":
        return False
    if run.id in record.cancel_asked:
        return True
    ending = record.endings.get(run.id)
    return not run.shutdown and (ending is None or ending.code == CANCELLED_CODE)


def plan(
    runs: Sequence[SeenRun],
    record: Record | None,
    now: datetime,
    settings: RecoverySettings,
) -> list[Action]:
    """Return what the watchdog does for one campaign, each action with when it is due.

    ``record`` None: the provenance was not read; the plan is ``[ReadRecord()]`` when
    it needs it, else what Prefect's states alone decide (nothing, so far). Pure: the
    same arguments give the same plan.
    """
    try:
        return _plan(runs, record, now, settings)
    except _UnreadError:
        return [ReadRecord()]


def _plan(
    runs: Sequence[SeenRun], record: Record | None, now: datetime, settings: RecoverySettings
) -> list[Action]:
    actions: list[Action] = []
    after: list[SeenRun] = []
    for run in runs:
        action = _judge(run, record, now, settings)
        if action is not None:
            actions.append(action)
        after.append(_after(run, action) if action is not None and action.at <= now else run)
    if any(run.state in ACTIVE for run in after):
        return actions
    # Runs made with other parameters (by anyone holding the secret) are never
    # continued, and never hide the owner's own run from recovery.
    ours = [run for run in after if run.ours]
    if not ours:
        return actions
    newest = max(ours, key=lambda run: run.created)
    found = _need(record)
    cancelled = _person_cancelled(newest, found)
    reason = continuation_reason(newest, found.endings.get(newest.id))
    if cancelled and found.status in STILL_GOING:
        actions.append(RecordCancel(newest.id, now))
        return actions
    if cancelled or (reason is not None and not found.resumable):
        actions.append(Leave(newest.id, cancelled, found.status, found.code, now))
        return actions
    if reason is None:
        return actions
    why, counted = reason
    tally = found.tally
    if counted and tally.exhausted:
        actions.append(StopExhausted(newest.id, why, now, tally.count))
        return actions
    not_before = (tally.not_before(settings) if counted else None) or now
    number = tally.count + 1 if counted else 0
    actions.append(Continue(newest.id, why, counted, max(now, not_before), number, tally.cap))
    return actions
