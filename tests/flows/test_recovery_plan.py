"""The recovery plan: what the watchdog does for a campaign, decided from what it sees (no I/O)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flows._engine._fencing import RecoverySettings
from flows._prefect._recovery_plan import (
    ACTIVE,
    Action,
    Continuations,
    Continue,
    CrashOrphan,
    EndCancel,
    Leave,
    ReadRecord,
    Record,
    RecordCancel,
    SeenLease,
    SeenRun,
    Settle,
    StopExhausted,
    alive_until,
    plan,
)
from flows._provenance import RunEnding

SETTINGS = RecoverySettings(lease_ttl_seconds=60, heartbeat_seconds=10, watchdog_seconds=2)
NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
TTL = timedelta(seconds=60)
NO_CONTINUATIONS = Continuations()
LONG_AGO = NOW - timedelta(seconds=300)
JUST_NOW = NOW - timedelta(seconds=5)


def run(
    state: str,
    *,
    id: str = "r1",
    since: datetime = LONG_AGO,
    created: datetime = LONG_AGO,
    ours: bool = True,
    alive_here: bool = False,
    shutdown: bool = False,
) -> SeenRun:
    return SeenRun(id, state, since, created, ours, alive_here, shutdown)


def lease(
    owner: str = "r1",
    *,
    released: bool = False,
    expires_at: datetime = NOW + TTL,
    gone: bool = False,
) -> SeenLease:
    return SeenLease(owner, 4242, released, expires_at, gone)


def ending(
    status: str = "completed", code: str | None = None, *, id: str = "r1", at: datetime = JUST_NOW
) -> RunEnding:
    return RunEnding(id, status, code, at)


def record(
    status: str | None = "running",
    code: str | None = None,
    *,
    lease: SeenLease | None = None,
    endings: tuple[RunEnding, ...] = (),
    asked: frozenset[str] = frozenset(),
    tally: Continuations = NO_CONTINUATIONS,
) -> Record:
    return Record(status, code, lease, {e.flow_run_id: e for e in endings}, asked, tally)


def kinds(actions: list[Action]) -> list[str]:
    return [type(a).__name__ for a in actions]


def due(actions: list[Action]) -> list[str]:
    return [type(a).__name__ for a in actions if a.at <= NOW]


class TestAlive:
    """One definition of alive: a process here, a live lease, else a TTL from its last word."""

    def test_a_run_executed_here_is_alive_whatever_the_record(self) -> None:
        assert alive_until(run("RUNNING", alive_here=True), None, NOW, SETTINGS) == (None, "")

    def test_a_live_lease_has_no_deadline(self) -> None:
        assert alive_until(run("RUNNING"), record(lease=lease()), NOW, SETTINGS)[0] is None

    def test_a_gone_holder_is_dead_now(self) -> None:
        until, why = alive_until(run("RUNNING"), record(lease=lease(gone=True)), NOW, SETTINGS)
        assert until == NOW
        assert why == "its process (pid 4242) is gone"

    def test_an_expired_lease_ended_when_it_expired(self) -> None:
        expired = NOW - timedelta(seconds=7)
        until, why = alive_until(
            run("RUNNING"), record(lease=lease(expires_at=expired)), NOW, SETTINGS
        )
        assert until == expired
        assert why == "lease expired 7 s ago"

    def test_without_the_lease_a_run_has_a_ttl_from_entering_its_state(self) -> None:
        until, why = alive_until(run("RUNNING", since=JUST_NOW), record(), NOW, SETTINGS)
        assert until == JUST_NOW + TTL
        assert why == "running for 5 s without holding the campaign's lease"

    def test_a_run_that_recorded_its_ending_has_a_ttl_from_the_ending(self) -> None:
        found = record(lease=lease(released=True), endings=(ending(at=JUST_NOW),))
        assert alive_until(run("RUNNING"), found, NOW, SETTINGS)[0] == JUST_NOW + TTL

    def test_a_lease_someone_else_holds_is_not_this_runs(self) -> None:
        found = record(lease=lease(owner="r2"))
        assert alive_until(run("RUNNING"), found, NOW, SETTINGS)[0] == LONG_AGO + TTL


# (runs, record, the kinds of the actions, the kinds due now)
CASES = {
    # Nothing to do, and nothing read: a run of this runner is active, or one waits.
    "running-here": ([run("RUNNING", alive_here=True)], None, [], []),
    "paused": ([run("PAUSED")], None, [], []),
    "scheduled": ([run("SCHEDULED")], None, [], []),
    # The provenance is needed to judge these.
    "running-elsewhere": ([run("RUNNING")], None, ["ReadRecord"], ["ReadRecord"]),
    "completed-needs-its-ending": ([run("COMPLETED")], None, ["ReadRecord"], ["ReadRecord"]),
    "cancelling-beside-a-run-here": (
        [run("RUNNING", alive_here=True), run("CANCELLING", id="r2")],
        None,
        ["ReadRecord"],
        ["ReadRecord"],
    ),
    # Orphans.
    "live-lease": ([run("RUNNING")], record(lease=lease()), [], []),
    "holder-gone": (
        [run("RUNNING")],
        record(lease=lease(gone=True)),
        ["CrashOrphan", "Continue"],
        ["CrashOrphan", "Continue"],
    ),
    "lease-expired": (
        [run("PENDING")],
        record(lease=lease(expires_at=NOW - timedelta(seconds=1))),
        ["CrashOrphan", "Continue"],
        ["CrashOrphan", "Continue"],
    ),
    "lease-less-young": ([run("RUNNING", since=JUST_NOW)], record(), ["CrashOrphan"], []),
    "lease-less-old": (
        [run("RUNNING")],
        record(),
        ["CrashOrphan", "Continue"],
        ["CrashOrphan", "Continue"],
    ),
    "orphan-of-a-campaign-that-ended-is-not-continued": (
        [run("RUNNING")],
        record("completed"),
        ["CrashOrphan", "Leave"],
        ["CrashOrphan", "Leave"],
    ),
    # Issue 43: a run that recorded its ending is never an orphan, whatever the lease says.
    "finished-lease-released": (
        [run("RUNNING")],
        record("completed", lease=lease(released=True), endings=(ending(),)),
        ["Settle"],
        [],
    ),
    "finished-holder-gone": (
        [run("RUNNING")],
        record("completed", lease=lease(gone=True), endings=(ending(),)),
        ["Settle"],
        ["Settle"],
    ),
    "finished-long-ago-settled": (
        [run("RUNNING")],
        record("completed", lease=lease(released=True), endings=(ending(at=LONG_AGO),)),
        ["Settle"],
        ["Settle"],
    ),
    "finished-and-completed": (
        [run("COMPLETED")],
        record("completed", endings=(ending(),)),
        [],
        [],
    ),
    # Ended runs with no active run: continued, recorded or left.
    "crashed": ([run("CRASHED")], record(), ["Continue"], ["Continue"]),
    "crashed-awaiting-approval": (
        [run("CRASHED")],
        record("awaiting_approval"),
        ["Continue"],
        ["Continue"],
    ),
    "crashed-but-finished": (
        [run("CRASHED")],
        record("completed", endings=(ending(),)),
        [],
        [],
    ),
    "crashed-campaign-blocked": (
        [run("CRASHED")],
        record("blocked", "policy_denied"),
        ["Leave"],
        ["Leave"],
    ),
    "shutdown": ([run("CANCELLED", shutdown=True)], record(), ["Continue"], ["Continue"]),
    "shutdown-after-a-cancel-asked": (
        [run("CANCELLED", shutdown=True)],
        record(asked=frozenset({"r1"})),
        ["RecordCancel"],
        ["RecordCancel"],
    ),
    "a-persons-cancel": ([run("CANCELLED")], record(), ["RecordCancel"], ["RecordCancel"]),
    "a-cancel-already-recorded": (
        [run("CANCELLED")],
        record("blocked", "cancelled", endings=(ending("blocked", "cancelled"),)),
        ["Leave"],
        ["Leave"],
    ),
    "fenced-out": (
        [run("CANCELLED")],
        record(endings=(ending("failed", "fenced_out"),)),
        [],
        [],
    ),
    "rejected-is-cancelled-in-prefect": (
        [run("CANCELLED")],
        record("blocked", "approval_rejected", endings=(ending("blocked", "approval_rejected"),)),
        [],
        [],
    ),
    "storage-failed-recorded": (
        [run("FAILED")],
        record("failed", "storage_unavailable", endings=(ending("failed", "storage_unavailable"),)),
        ["Continue"],
        ["Continue"],
    ),
    "storage-failed-unrecorded": (
        [run("FAILED")],
        record("failed", "storage_unavailable"),
        ["Continue"],
        ["Continue"],
    ),
    "failed-by-policy": (
        [run("FAILED")],
        record("failed", "internal", endings=(ending("failed", "internal"),)),
        [],
        [],
    ),
    # Issue 42: a waiting run forced out through the API.
    "forced-completed-while-waiting": (
        [run("COMPLETED")],
        record("awaiting_approval"),
        ["Continue"],
        ["Continue"],
    ),
    "forced-failed-while-waiting": (
        [run("FAILED")],
        record("awaiting_approval"),
        ["Continue"],
        ["Continue"],
    ),
    "forced-cancelled-while-waiting": (
        [run("CANCELLED")],
        record("awaiting_approval"),
        ["RecordCancel"],
        ["RecordCancel"],
    ),
    # Cancelling runs nobody stops.
    "cancelling-young": ([run("CANCELLING", since=JUST_NOW)], record(), ["EndCancel"], []),
    "cancelling-left-open": (
        [run("CANCELLING")],
        record(),
        ["EndCancel", "RecordCancel"],
        ["EndCancel", "RecordCancel"],
    ),
    "cancelling-with-a-live-lease": ([run("CANCELLING")], record(lease=lease()), [], []),
    "cancelling-here": ([run("CANCELLING", alive_here=True)], None, [], []),
    # Several runs: the newest of the owner's decides, an active one defers.
    "older-crash-newer-completed": (
        [run("CRASHED"), run("COMPLETED", id="r2", created=JUST_NOW)],
        record("completed", endings=(ending(id="r2"),)),
        [],
        [],
    ),
    "crash-beside-a-waiting-run": (
        [run("CRASHED"), run("PAUSED", id="r2", created=JUST_NOW)],
        None,
        [],
        [],
    ),
    "a-foreign-newer-run-never-hides-ours": (
        [run("CRASHED"), run("FAILED", id="r2", created=JUST_NOW, ours=False)],
        record(),
        ["Continue"],
        ["Continue"],
    ),
    "only-foreign-runs": ([run("CRASHED", ours=False)], record(), [], []),
}


class TestPlan:
    @pytest.mark.parametrize(("runs", "found", "expected", "now"), CASES.values(), ids=CASES.keys())
    def test_each_case(
        self, runs: list[SeenRun], found: Record | None, expected: list[str], now: list[str]
    ) -> None:
        actions = plan(runs, found, NOW, SETTINGS)
        assert kinds(actions) == expected
        assert due(actions) == now

    def test_the_orphans_continuation_is_counted_and_numbered(self) -> None:
        tally = Continuations(count=2, last_at=NOW - timedelta(seconds=1), cap=5)
        actions = plan([run("CRASHED")], record(tally=tally), NOW, SETTINGS)
        (action,) = actions
        assert isinstance(action, Continue)
        assert (action.counted, action.number, action.cap) == (True, 3, 5)
        # 2 s x 2**1 after the last one: not yet.
        assert action.at == NOW - timedelta(seconds=1) + timedelta(seconds=4)

    def test_a_runners_shutdown_is_not_counted_and_not_paused(self) -> None:
        tally = Continuations(count=4, last_at=NOW, cap=5)
        (action,) = plan([run("CANCELLED", shutdown=True)], record(tally=tally), NOW, SETTINGS)
        assert isinstance(action, Continue)
        assert (action.counted, action.at) == (False, NOW)

    def test_at_the_cap_the_campaign_is_stopped_instead(self) -> None:
        tally = Continuations(count=5, last_at=NOW, cap=5)
        (action,) = plan([run("CRASHED")], record(tally=tally), NOW, SETTINGS)
        assert action == StopExhausted("r1", "its run crashed", NOW, 5)

    def test_an_orphan_names_why(self) -> None:
        (crash, _continue) = plan([run("RUNNING")], record(lease=lease(gone=True)), NOW, SETTINGS)
        assert crash == CrashOrphan("r1", "its process (pid 4242) is gone", NOW)

    def test_a_finished_run_is_settled_from_its_ending_a_ttl_after_it(self) -> None:
        end = ending("blocked", "policy_denied")
        (action,) = plan([run("RUNNING")], record("blocked", endings=(end,)), NOW, SETTINGS)
        assert action == Settle("r1", end, JUST_NOW + TTL)

    def test_a_cancelling_run_is_given_a_ttl_from_its_cancel(self) -> None:
        cancelled = NOW - timedelta(seconds=30)
        (action,) = plan([run("CANCELLING", since=cancelled)], record(), NOW, SETTINGS)
        assert isinstance(action, EndCancel)
        assert action.at == cancelled + TTL


STATES = st.sampled_from(
    [
        *("SCHEDULED", "PENDING", "RUNNING", "PAUSED", "CANCELLING"),
        *("COMPLETED", "FAILED", "CRASHED", "CANCELLED"),
    ]
)
MOMENTS = st.integers(min_value=-600, max_value=600).map(lambda s: NOW + timedelta(seconds=s))
STATUSES = st.sampled_from(
    ["running", "awaiting_approval", "completed", "blocked", "escalated", "failed", None]
)
ENDINGS = st.sampled_from(
    [None, ("completed", None), ("blocked", "policy_denied"), ("failed", "storage_unavailable")]
)


@st.composite
def campaigns(draw: st.DrawFn) -> tuple[list[SeenRun], Record]:
    count = draw(st.integers(min_value=1, max_value=4))
    runs, endings = [], []
    for n in range(count):
        seen = SeenRun(
            f"r{n}",
            draw(STATES),
            draw(MOMENTS),
            NOW - timedelta(seconds=1000 - n),
            draw(st.booleans()),
            draw(st.booleans()),
            draw(st.booleans()),
        )
        runs.append(seen)
        said = draw(ENDINGS)
        if said is not None:
            endings.append(RunEnding(seen.id, said[0], said[1], draw(MOMENTS)))
    held = draw(st.one_of(st.none(), st.sampled_from([r.id for r in runs])))
    found = Record(
        draw(STATUSES),
        draw(st.sampled_from([None, "storage_unavailable", "cancelled"])),
        None
        if held is None
        else SeenLease(held, 1, draw(st.booleans()), draw(MOMENTS), draw(st.booleans())),
        {e.flow_run_id: e for e in endings},
        frozenset(r.id for r in runs if draw(st.booleans())),
        Continuations(draw(st.integers(0, 6)), draw(st.one_of(st.none(), MOMENTS)), (0, 0), 5),
    )
    return runs, found


class TestPlanProperties:
    @given(campaigns())
    def test_a_run_that_recorded_its_ending_is_never_crashed(
        self, seen: tuple[list[SeenRun], Record]
    ) -> None:
        runs, found = seen
        for action in plan(runs, found, NOW, SETTINGS):
            if isinstance(action, CrashOrphan):
                assert action.run_id not in found.endings

    @given(campaigns())
    def test_a_run_executed_here_is_never_touched(self, seen: tuple[list[SeenRun], Record]) -> None:
        runs, found = seen
        here = {r.id for r in runs if r.alive_here}
        for action in plan(runs, found, NOW, SETTINGS):
            if isinstance(action, CrashOrphan | Settle | EndCancel):
                assert action.run_id not in here

    @given(campaigns())
    def test_nothing_is_continued_while_a_run_stays_active(
        self, seen: tuple[list[SeenRun], Record]
    ) -> None:
        runs, found = seen
        actions = plan(runs, found, NOW, SETTINGS)
        ended_now = {getattr(a, "run_id", None) for a in actions if a.at <= NOW}
        if any(r.state in ACTIVE and r.id not in ended_now for r in runs):
            assert not any(isinstance(a, Continue | StopExhausted | RecordCancel) for a in actions)

    @given(campaigns())
    def test_a_campaign_that_is_not_going_is_never_continued(
        self, seen: tuple[list[SeenRun], Record]
    ) -> None:
        runs, found = seen
        if not found.resumable:
            actions = plan(runs, found, NOW, SETTINGS)
            assert not any(isinstance(a, Continue | StopExhausted | RecordCancel) for a in actions)

    @given(campaigns())
    def test_without_the_record_the_plan_asks_for_it_or_does_nothing(
        self, seen: tuple[list[SeenRun], Record]
    ) -> None:
        runs, found = seen
        unread = plan(runs, None, NOW, SETTINGS)
        assert unread in ([], [ReadRecord()])
        if not unread:  # decided from Prefect's states alone: the record changes nothing
            assert plan(runs, found, NOW, SETTINGS) == []

    @given(campaigns())
    def test_one_continuation_at_most(self, seen: tuple[list[SeenRun], Record]) -> None:
        runs, found = seen
        actions = plan(runs, found, NOW, SETTINGS)
        assert sum(isinstance(a, Continue | StopExhausted | RecordCancel) for a in actions) <= 1

    @given(campaigns())
    def test_the_plan_is_pure(self, seen: tuple[list[SeenRun], Record]) -> None:
        runs, found = seen
        assert plan(runs, found, NOW, SETTINGS) == plan(list(runs), found, NOW, SETTINGS)


def test_record_cancel_only_for_a_campaign_still_going() -> None:
    stopped = record("failed", "storage_unavailable")
    assert plan([run("CANCELLED")], stopped, NOW, SETTINGS) == [
        Leave("r1", True, "failed", "storage_unavailable", NOW)
    ]
    assert plan([run("CANCELLED")], record("running"), NOW, SETTINGS) == [RecordCancel("r1", NOW)]
