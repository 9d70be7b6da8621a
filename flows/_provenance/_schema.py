"""The provenance tables, as sqlmodel classes.

One campaign has rounds; a round has gate calls (more than one after a policy
Retry), each gate call has attempts; a round also has policy decisions,
approvals (with every decision attempt in ``approval_event``) and batches, and
a batch has task results. A campaign also has the batch allocations its
workers ran in (one row per scheduler job: requested, started, ended, why).
Rows are addressed by natural keys (campaign name,
round index, call index, attempt number, batch key, ...) so that recording the
same event twice after a crash finds the row that is already there. The
non-unique ``ix_*`` indexes serve the reads of ``unattended inspect``
(revision 0002 adds them; revision 0006 adds allocations and the task's job).

This module is the shape of the head revision; the migrations in
``flows/_provenance/_migrations/versions`` are what builds it in a database.
"""

from datetime import datetime
from typing import Any, Final, Literal, TypeAlias, get_args

from sqlalchemy import (
    JSON,
    CheckConstraint,
    DateTime,
    ForeignKeyConstraint,
    Index,
    MetaData,
    Table,
    Text,
    UniqueConstraint,
)
from sqlmodel import Field, SQLModel

# A campaign's (and a round's) status. A stopped run is blocked, escalated or failed,
# always with a stable error code beside it.
CampaignStatus: TypeAlias = Literal[
    "running",
    "completed",
    "blocked",
    "escalated",
    "awaiting_approval",
    "failed",
]
CAMPAIGN_STATUSES: Final[tuple[CampaignStatus, ...]] = get_args(CampaignStatus)
# How one flow run of a campaign ended, as the flow itself recorded it (revision 0011):
# a campaign status other than ``running``, with the stable code of a stopped run.
EndingStatus: TypeAlias = Literal[
    "completed",
    "blocked",
    "escalated",
    "awaiting_approval",
    "failed",
]
ENDING_STATUSES: Final[tuple[EndingStatus, ...]] = get_args(EndingStatus)
ROUND_STATUSES: Final = CAMPAIGN_STATUSES
# ``failed``: a failing producer or check stopped the call (revision 0010).
DISPOSITIONS: Final = ("pending", "accepted", "fallback", "not_accepted", "failed")
APPROVAL_DECISIONS: Final = ("approved", "rejected", "timeout", "not_allowed")
BATCH_STATUSES: Final = ("launched", "finished")
TASK_STATUSES: Final = ("done", "failed", "timeout", "cancelled", "interrupted")
# What became of one candidate of a gate call (see CandidateFateRow).
CANDIDATE_FATES: Final = ("launched", "refused", "struck", "skipped")
CANDIDATE_SOURCES: Final = ("proposal", "fallback")
ALLOCATION_END_REASONS: Final = (
    "completed",
    "timeout",
    "cancelled",
    "node_fail",
    "preempted",
    "failed",
    "unknown",
    "released",
)


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def _round_fk(table: str) -> ForeignKeyConstraint:
    return ForeignKeyConstraint(
        ["campaign_id", "round_index"],
        ["round.campaign_id", "round.round_index"],
        name=f"fk_{table}_round",
        ondelete="CASCADE",
    )


_TS = DateTime(timezone=True)


class Campaign(SQLModel, table=True):
    """A campaign: its spec, where it runs and how it ended."""

    __tablename__ = "campaign"
    __table_args__ = (CheckConstraint(_in("status", CAMPAIGN_STATUSES), name="ck_campaign_status"),)

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(unique=True)
    spec: dict[str, Any] = Field(sa_type=JSON)
    site: str
    seed: int
    code_version: str
    status: str = "running"
    error_code: str | None = None
    created_at: datetime = Field(sa_type=_TS)
    updated_at: datetime = Field(sa_type=_TS)


class Round(SQLModel, table=True):
    """One round and the checkpointed states the next round starts from."""

    __tablename__ = "round"
    __table_args__ = (
        Index("ix_round_campaign_status", "campaign_id", "status"),
        UniqueConstraint("campaign_id", "round_index", name="uq_round_campaign_index"),
        CheckConstraint(_in("status", ROUND_STATUSES), name="ck_round_status"),
    )

    id: int | None = Field(default=None, primary_key=True)
    campaign_id: int = Field(foreign_key="campaign.id", ondelete="CASCADE")
    round_index: int
    status: str = "running"
    surrogate_state: Any | None = Field(default=None, sa_type=JSON)
    policy_state: Any | None = Field(default=None, sa_type=JSON)
    planner_state: Any | None = Field(default=None, sa_type=JSON)
    started_at: datetime = Field(sa_type=_TS)
    finished_at: datetime | None = Field(default=None, sa_type=_TS)


class GateCall(SQLModel, table=True):
    """One call of the accept gate, with the fallback computed before it."""

    __tablename__ = "gate_call"
    __table_args__ = (
        Index("ix_gate_call_campaign_disposition", "campaign_id", "disposition"),
        UniqueConstraint("campaign_id", "round_index", "call_index", name="uq_gate_call"),
        _round_fk("gate_call"),
        CheckConstraint(_in("disposition", DISPOSITIONS), name="ck_gate_call_disposition"),
    )

    id: int | None = Field(default=None, primary_key=True)
    campaign_id: int
    round_index: int
    call_index: int
    name: str
    budget: int
    attempts_used: int = 0
    disposition: str = "pending"
    fallback_hash: str | None = None
    fallback_value: Any | None = Field(default=None, sa_type=JSON)
    fallback_computed_at: datetime = Field(sa_type=_TS)


class AttemptRow(SQLModel, table=True):
    """One producer call and every verdict the checks gave it."""

    __tablename__ = "attempt"
    __table_args__ = (UniqueConstraint("gate_call_id", "number", name="uq_attempt"),)

    id: int | None = Field(default=None, primary_key=True)
    gate_call_id: int = Field(foreign_key="gate_call.id", ondelete="CASCADE")
    number: int
    value: Any | None = Field(default=None, sa_type=JSON)
    rejected_by: str | None = None
    reason: str | None = Field(default=None, sa_type=Text)
    verdicts: list[dict[str, Any]] = Field(sa_type=JSON)
    scores: dict[str, float] = Field(sa_type=JSON)
    duration: float
    trace_id: str | None = None
    span_id: str | None = None
    # The check that failed (a crashed verifier), not a rejection (revision 0009; None
    # before it). Its verdict's details hold the task's status, exit code and stderr tail.
    failed_by: str | None = None


class PolicyDecision(SQLModel, table=True):
    """One policy evaluation of a round (``seq`` orders them within the round)."""

    __tablename__ = "policy_decision"
    __table_args__ = (
        Index("ix_policy_decision_campaign", "campaign_id", "outcome"),
        UniqueConstraint("campaign_id", "round_index", "seq", name="uq_policy_decision"),
        _round_fk("policy_decision"),
    )

    id: int | None = Field(default=None, primary_key=True)
    campaign_id: int
    round_index: int
    seq: int
    outcome: str
    reason: str | None = Field(default=None, sa_type=Text)
    code: str | None = None
    rules_fired: Any | None = Field(default=None, sa_type=JSON)
    severities: Any | None = Field(default=None, sa_type=JSON)
    explanation: str | None = Field(default=None, sa_type=Text)
    shadow: Any | None = Field(default=None, sa_type=JSON)
    state_after: Any | None = Field(default=None, sa_type=JSON)
    extra: dict[str, Any] | None = Field(default=None, sa_type=JSON)
    recorded_at: datetime = Field(sa_type=_TS)


class Approval(SQLModel, table=True):
    """One approval request and the decision that settled it."""

    __tablename__ = "approval"
    __table_args__ = (
        Index("ix_approval_campaign_round", "campaign_id", "round_index"),
        _round_fk("approval"),
        CheckConstraint(
            "decision IS NULL OR " + _in("decision", APPROVAL_DECISIONS),
            name="ck_approval_decision",
        ),
    )

    id: int | None = Field(default=None, primary_key=True)
    campaign_id: int
    round_index: int
    key: str = Field(unique=True)
    rule: str | None = None
    approvers_allowed: list[str] = Field(sa_type=JSON)
    requested_at: datetime = Field(sa_type=_TS)
    description: str | None = Field(default=None, sa_type=Text)
    # The batch allocation's window as the requesting process saw it (revision 0003):
    # the approval deadline stops short of its end, on every replay and in the watchdog.
    allocation_start: datetime | None = Field(default=None, sa_type=_TS)
    allocation_end: datetime | None = Field(default=None, sa_type=_TS)
    flow_run_id: str | None = None
    decided_by: str | None = None
    decision: str | None = None
    comment: str | None = Field(default=None, sa_type=Text)
    overrides: Any | None = Field(default=None, sa_type=JSON)
    decided_at: datetime | None = Field(default=None, sa_type=_TS)
    # The request's rules when it was made (revision 0008; None before it): a later
    # change of the campaign's inputs applies from the next request on.
    require_proof: bool | None = None
    allow_override: bool | None = None


class ApprovalEvent(SQLModel, table=True):
    """Every decision attempt on an approval, including refused approvers."""

    __tablename__ = "approval_event"
    __table_args__ = (
        Index("ix_approval_event_approval", "approval_id"),
        UniqueConstraint("approval_id", "event_key", name="uq_approval_event_key"),
        CheckConstraint(_in("decision", APPROVAL_DECISIONS), name="ck_approval_event_decision"),
    )

    id: int | None = Field(default=None, primary_key=True)
    approval_id: int = Field(foreign_key="approval.id", ondelete="CASCADE")
    event_key: str | None = None
    decided_by: str | None = None
    decision: str
    comment: str | None = Field(default=None, sa_type=Text)
    overrides: Any | None = Field(default=None, sa_type=JSON)
    allowed: bool
    settled: bool
    recorded_at: datetime = Field(sa_type=_TS)
    # How the approver proved who they are ("totp ok", "totp failed", ...); never the code.
    proof: str | None = None
    # Why a refused answer was refused when it was not the approver (revision 0008).
    refusal: str | None = None


class Batch(SQLModel, table=True):
    """One batch launched on the allocation, addressed by its idempotency key."""

    __tablename__ = "batch"
    __table_args__ = (
        Index("ix_batch_campaign_round", "campaign_id", "round_index"),
        _round_fk("batch"),
        CheckConstraint(_in("status", BATCH_STATUSES), name="ck_batch_status"),
    )

    id: int | None = Field(default=None, primary_key=True)
    key: str = Field(unique=True)
    campaign_id: int
    round_index: int
    candidates: list[Any] = Field(sa_type=JSON)
    backend: str
    launched_at: datetime = Field(sa_type=_TS)
    finished_at: datetime | None = Field(default=None, sa_type=_TS)
    status: str = "launched"
    # 0 for the round's batch; n for the n-th relaunch of its interrupted candidates.
    relaunch: int = Field(default=0, sa_column_kwargs={"server_default": "0"})


class TaskResultRow(SQLModel, table=True):
    """What one simulation task of a batch came back with.

    ``objective`` is the numeric value (the value itself, or its ``"objective"``
    or ``"value"`` field), kept so "best result" is one indexed query. ``host`` is
    the node the task ran on; ``job_id`` the scheduler job (allocation) and
    ``allocation_start``/``allocation_end`` that job's start and planned end.
    """

    __tablename__ = "task_result"
    __table_args__ = (
        Index("ix_task_result_batch_objective", "batch_id", "objective"),
        UniqueConstraint("batch_id", "task_index", name="uq_task_result"),
        CheckConstraint(_in("status", TASK_STATUSES), name="ck_task_result_status"),
    )

    id: int | None = Field(default=None, primary_key=True)
    batch_id: int = Field(foreign_key="batch.id", ondelete="CASCADE")
    task_index: int
    key: str
    candidate: Any | None = Field(default=None, sa_type=JSON)
    status: str
    value: Any | None = Field(default=None, sa_type=JSON)
    objective: float | None = None
    runtime: float | None = None
    host: str | None = None
    exit_code: int | None = None
    stderr_tail: str | None = Field(default=None, sa_type=Text)
    attempts: int = 1
    error_code: str | None = None
    retries: Any | None = Field(default=None, sa_type=JSON)
    job_id: str | None = None
    allocation_start: datetime | None = Field(default=None, sa_type=_TS)
    allocation_end: datetime | None = Field(default=None, sa_type=_TS)


class Allocation(SQLModel, table=True):
    """One batch job that carried a campaign's workers: asked for, started, ended, and why.

    ``request`` numbers the campaign's requests from 1 (jobs of one request share
    it). ``ends_at`` is the planned end (start + walltime); ``ended_at`` the real one;
    ``end_reason`` one of ``ALLOCATION_END_REASONS`` (``released``: the campaign let it
    go). ``state``/``reason`` are the scheduler's words as last seen
    (``PENDING``/``Resources``).
    """

    __tablename__ = "allocation"
    __table_args__ = (
        UniqueConstraint("campaign_id", "job_id", name="uq_allocation_job"),
        Index("ix_allocation_campaign_request", "campaign_id", "request"),
        CheckConstraint(
            "end_reason IS NULL OR " + _in("end_reason", ALLOCATION_END_REASONS),
            name="ck_allocation_end_reason",
        ),
    )

    id: int | None = Field(default=None, primary_key=True)
    campaign_id: int = Field(foreign_key="campaign.id", ondelete="CASCADE")
    job_id: str
    request: int
    state: str
    reason: str | None = None
    nodes: list[str] = Field(sa_type=JSON)
    node_count: int = 0
    requested_at: datetime = Field(sa_type=_TS)
    started_at: datetime | None = Field(default=None, sa_type=_TS)
    ends_at: datetime | None = Field(default=None, sa_type=_TS)
    ended_at: datetime | None = Field(default=None, sa_type=_TS)
    end_reason: str | None = None
    updated_at: datetime = Field(sa_type=_TS)


class CampaignLease(SQLModel, table=True):
    """Which run may act for a campaign now: one row per campaign (revision 0004).

    A run takes it at start (``owner`` is its flow-run id, ``token`` its process),
    renews ``heartbeat_at``/``expires_at`` while alive, and every write checks it in
    its own transaction, so a run that lost it records nothing more.
    """

    __tablename__ = "campaign_lease"

    campaign_id: int = Field(foreign_key="campaign.id", ondelete="CASCADE", primary_key=True)
    owner: str
    token: str
    host: str
    pid: int
    acquired_at: datetime = Field(sa_type=_TS)
    heartbeat_at: datetime = Field(sa_type=_TS)
    expires_at: datetime = Field(sa_type=_TS)
    released: bool = False


class InputPin(SQLModel, table=True):
    """The content hash of one input the spec names, per input revision (revision 0004)."""

    __tablename__ = "input_pin"
    __table_args__ = (UniqueConstraint("campaign_id", "revision", "name", name="uq_input_pin"),)

    id: int | None = Field(default=None, primary_key=True)
    campaign_id: int = Field(foreign_key="campaign.id", ondelete="CASCADE")
    revision: int
    name: str
    file: str | None = Field(default=None, sa_type=Text)
    sha256: str
    recorded_at: datetime = Field(sa_type=_TS)


class CampaignEvent(SQLModel, table=True):
    """Something that happened to the campaign outside its rounds (revision 0004).

    Kinds: ``fenced_out``, ``inputs_pinned``, ``inputs_revised``, ``spec_changed``,
    ``decision_mismatch``, ``orphan_crashed``, ``continued``, ``run_refused``.
    """

    __tablename__ = "campaign_event"
    __table_args__ = (Index("ix_campaign_event_campaign", "campaign_id", "kind"),)

    id: int | None = Field(default=None, primary_key=True)
    campaign_id: int = Field(foreign_key="campaign.id", ondelete="CASCADE")
    kind: str
    flow_run_id: str | None = None
    actor: str | None = None
    details: Any | None = Field(default=None, sa_type=JSON)
    recorded_at: datetime = Field(sa_type=_TS)


class RunEndingRow(SQLModel, table=True):
    """How one flow run ended, in the flow's own words: a status and a stable code (revision 0011).

    Written by the run as its last act while it still holds the campaign's lease (a run
    refused, fenced out or failed outside a round writes one too), or by whoever recorded
    a person's cancel of it. The runner's watchdog, ``status`` and the CLI read it instead
    of the run's Prefect state message; a run without one ended without saying how (killed,
    forced through the API, or its storage failed).
    """

    __tablename__ = "run_ending"
    __table_args__ = (
        UniqueConstraint("campaign_id", "flow_run_id", name="uq_run_ending"),
        CheckConstraint(_in("status", ENDING_STATUSES), name="ck_run_ending_status"),
    )

    id: int | None = Field(default=None, primary_key=True)
    campaign_id: int = Field(foreign_key="campaign.id", ondelete="CASCADE")
    flow_run_id: str
    status: str
    code: str | None = None
    recorded_at: datetime = Field(sa_type=_TS)


class CandidateFateRow(SQLModel, table=True):
    """What became of one candidate of a gate call, and why.

    ``source`` says whose candidate it is: the proposed batch, or the fallback
    (when a thinned batch was topped up from it, or a timed-out approval ran it);
    ``candidate_index`` is its position there. ``rule`` names the refusing rule,
    ``actor`` the approver who struck it; ``reason`` says why in words.
    """

    __tablename__ = "candidate_fate"
    __table_args__ = (
        UniqueConstraint(
            "campaign_id",
            "round_index",
            "call_index",
            "source",
            "candidate_index",
            name="uq_candidate_fate",
        ),
        _round_fk("candidate_fate"),
        CheckConstraint(_in("fate", CANDIDATE_FATES), name="ck_candidate_fate"),
        CheckConstraint(_in("source", CANDIDATE_SOURCES), name="ck_candidate_fate_source"),
    )

    id: int | None = Field(default=None, primary_key=True)
    campaign_id: int
    round_index: int
    call_index: int
    source: str
    candidate_index: int
    candidate: Any | None = Field(default=None, sa_type=JSON)
    fate: str
    rule: str | None = None
    actor: str | None = None
    reason: str | None = Field(default=None, sa_type=Text)
    recorded_at: datetime = Field(sa_type=_TS)


metadata = SQLModel.metadata


def provenance_tables() -> MetaData:
    """Return a metadata holding exactly this module's tables.

    ``SQLModel.metadata`` is shared by every table model in the process (a user's
    own included), so the head schema is built from a copy of ours only.
    """
    mine = MetaData()
    for model in SQLModel.__subclasses__():
        if model.__module__ == __name__ and hasattr(model, "__table__"):
            table(model).to_metadata(mine)
    return mine


def table(model: type[SQLModel]) -> Table:
    """Return the SQLAlchemy table of a table model."""
    return model.__table__  # type: ignore[attr-defined,no-any-return]  # set by sqlmodel
