"""What the store's readers return: frozen, plain records.

Rows are dataclasses (attribute access), so the batch launcher can treat a
stored :class:`TaskResultRecord` like the ``tasks.TaskResult`` it recorded.
:func:`as_dict` turns any of them into JSON-ready data.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import socket
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

# The score a verifier's prediction is recorded under on an accepted attempt: the batch's
# as ``verifier_prediction``, each candidate's as ``verifier_prediction.<index>``. The engine
# records it and the report reads it, so the name lives with the records.
PREDICTION_SCORE = "verifier_prediction"

TASK_RESULT_FIELDS = (
    "index",
    "key",
    "status",
    "value",
    "runtime",
    "host",
    "exit_code",
    "stderr_tail",
    "attempts",
    "error_code",
    "retries",
    "job_id",
)


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """Where a campaign stands: the last completed round's states and every round's status.

    ``last_completed_round`` is None when no round has completed; the states are
    then None too. ``surrogate_states`` are the completed rounds' surrogate states
    in round order (each round saves what it added; a round without one is left
    out). ``decisions`` are the policy's outcomes in the completed rounds, in order
    (read from the decisions themselves, not saved again with each round).
    """

    last_completed_round: int | None
    surrogate_states: tuple[Any, ...]
    policy_state: Any
    planner_state: Any
    rounds: dict[int, str]
    decisions: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class CandidateFateRecord:
    """What became of one candidate of a gate call (``fate`` one of CANDIDATE_FATES).

    ``source`` is ``proposal`` (the batch the gate returned) or ``fallback``;
    ``index`` is the candidate's position there.
    """

    source: str
    index: int
    candidate: list[float]
    fate: str
    rule: str | None = None
    actor: str | None = None
    reason: str | None = None


@dataclasses.dataclass(frozen=True)
class GateCallEnd:
    """How a gate call ended, to record with the decision taken on it.

    ``attempts`` are the call's attempts; those already recorded stand.
    """

    gate_call_id: int
    disposition: str
    attempts_used: int
    attempts: tuple[Any, ...] = ()


@dataclasses.dataclass(frozen=True)
class ApprovalEventRecord:
    """One decision attempt on an approval (``allowed`` False: a refused approver)."""

    decided_by: str | None
    decision: str
    comment: str | None
    overrides: Any
    allowed: bool
    settled: bool
    recorded_at: datetime
    event_key: str | None = None  # the pause key the answer came in on
    proof: str | None = None  # "totp ok", "totp failed", ... (None: no proof was asked)
    refusal: str | None = None  # why it was refused, when not for who answered


@dataclasses.dataclass(frozen=True)
class ApprovalRow:
    """An approval request, its settling decision (None while pending) and every event."""

    key: str
    campaign: str
    round_index: int
    rule: str | None
    approvers_allowed: list[str]
    requested_at: datetime
    description: str | None
    allocation_start: datetime | None
    allocation_end: datetime | None
    flow_run_id: str | None
    decided_by: str | None
    decision: str | None
    comment: str | None
    overrides: Any
    decided_at: datetime | None
    events: tuple[ApprovalEventRecord, ...]
    # The request's rules when it was made (None: recorded before they were kept).
    require_proof: bool | None = None
    allow_override: bool | None = None

    @property
    def settled(self) -> bool:
        """Return True once a decision settled the request."""
        return self.decision is not None


@dataclasses.dataclass(frozen=True)
class TaskResultRecord:
    """A stored task result, with the ``tasks.TaskResult`` attributes plus its candidate."""

    index: int
    key: str
    status: str
    value: Any
    runtime: float | None
    host: str | None
    exit_code: int | None
    stderr_tail: str | None
    attempts: int
    error_code: str | None
    retries: Any
    candidate: Any = None
    job_id: str | None = None
    allocation_start: datetime | None = None
    allocation_end: datetime | None = None


def utc(moment: datetime | None) -> datetime | None:
    """Return ``moment`` as an aware UTC datetime (SQLite hands back naive ones)."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def now() -> datetime:
    """Return the current time, aware, in UTC."""
    return datetime.now(UTC)


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if hasattr(obj, "tolist"):  # numpy arrays and scalars, without importing numpy
        return obj.tolist()
    if isinstance(obj, set | frozenset):
        return sorted(obj, key=repr)
    if isinstance(obj, datetime):
        return obj.isoformat()
    raise TypeError(f"value of type {type(obj).__name__} is not JSON-serialisable")


def _finite(value: Any) -> Any:
    # Strict JSON (PostgreSQL's json type) has no NaN or Infinity: store them as strings,
    # the way pydantic's ser_json_inf_nan="strings" does.
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


def json_text(value: Any) -> str:
    """Serialise ``value`` as strict JSON text (the engines' JSON column serializer)."""
    from pydantic_core import to_json  # writers only: the read path never loads it

    return to_json(value, inf_nan_mode="strings", fallback=_json_default).decode()


def jsonable(value: Any) -> Any:
    """Return ``value`` as strict JSON data (pydantic models, numpy, tuples converted)."""
    if value is None or isinstance(value, str | int | bool):
        return value
    if isinstance(value, float):
        return _finite(value)
    encoded = json.dumps(value, default=_json_default)
    decoded = json.loads(encoded)
    # Walk the structure only when the text shows a non-finite number somewhere.
    return _finite(decoded) if ("NaN" in encoded or "Infinity" in encoded) else decoded


def field(obj: Any, name: str, default: Any = None) -> Any:
    """Read ``name`` from a mapping or an object's attribute."""
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def objective_of(value: Any) -> float | None:
    """Return the numeric objective of a task value, or None when it has none."""
    if isinstance(value, Mapping):
        for name in ("objective", "value"):
            if name in value:
                return objective_of(value[name])
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def as_dict(record: Any) -> Any:
    """Return a row (or a list or tuple of rows) as JSON-ready data.

    Rows' JSON columns already hold plain data and are returned as they are;
    only dataclasses, tuples of rows and datetimes are converted.
    """
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        return {f.name: as_dict(getattr(record, f.name)) for f in dataclasses.fields(record)}
    if isinstance(record, tuple) or (
        isinstance(record, list) and record and dataclasses.is_dataclass(record[0])
    ):
        return [as_dict(v) for v in record]
    if isinstance(record, datetime):
        return utc(record).isoformat()  # type: ignore[union-attr]  # not None here
    return record


def process_gone(host: str, pid: int) -> bool:
    """Return True when ``pid`` on ``host`` is this host's and has exited.

    A killed process whose parent died too stays a zombie until init reaps it: up to
    2 s under some container inits, for ever under an init that never reaps. A zombie
    runs nothing and holds nothing, so it counts as gone.
    """
    if host != socket.gethostname():
        return False  # another node: only the expiry can tell
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    import psutil  # here: most readers of a lease never ask

    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


@dataclasses.dataclass(frozen=True)
class RunEnding:
    """How one flow run ended, as it recorded it (``run_ending``, revision 0011).

    ``status`` is a campaign status other than ``running`` (``EndingStatus``); ``code``
    the stable error code of a run that stopped (None for ``completed``).
    """

    flow_run_id: str
    status: str
    code: str | None
    recorded_at: datetime


@dataclasses.dataclass(frozen=True)
class LeaseRow:
    """Who holds a campaign's lease, and until when."""

    owner: str
    token: str
    host: str
    pid: int
    heartbeat_at: datetime
    expires_at: datetime
    released: bool

    def expired(self, moment: datetime | None = None) -> bool:
        """Return whether the lease lapsed (or was released) at ``moment``."""
        return self.released or (moment or now()) >= self.expires_at

    def holder_gone(self) -> bool:
        """Return whether the holder's process is known to be dead (same host only)."""
        return process_gone(self.host, self.pid)
