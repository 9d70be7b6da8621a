"""Run the read model's SQL text on stdlib ``sqlite3`` or on a SQLAlchemy connection.

The queries (``flows/_provenance/_readers.py``) are plain SQL with ``:named``
parameters, written once. A :class:`Reader` runs them and returns each row as a
dict, decoding the columns SQL cannot type: JSON text, timestamps and booleans.
Which columns those are is :data:`COLUMNS`, the head schema's columns in table
order (a test checks it equals ``_schema.py``, so it cannot drift); a result
column is decoded by its name (each name has one kind across all tables).

Timestamps come back timezone-aware in UTC, whatever the driver handed over
(SQLite text or a naive datetime, PostgreSQL an aware one), as the store wrote them.
This module imports no SQLAlchemy: :class:`AlchemyReader` imports it when used.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any, Final

from flows._provenance._rows import utc

# Each table's columns in order; ":json", ":ts" (timestamp with time zone) and ":bool"
# mark the columns a reader decodes.
COLUMNS: Final[dict[str, str]] = {
    "campaign": "id name spec:json site seed code_version status error_code created_at:ts "
    "updated_at:ts",
    "round": "id campaign_id round_index status surrogate_state:json policy_state:json "
    "planner_state:json started_at:ts finished_at:ts",
    "gate_call": "id campaign_id round_index call_index name budget attempts_used disposition "
    "fallback_hash fallback_value:json fallback_computed_at:ts",
    "attempt": "id gate_call_id number value:json rejected_by reason verdicts:json scores:json "
    "duration trace_id span_id failed_by",
    "policy_decision": "id campaign_id round_index seq outcome reason code rules_fired:json "
    "severities:json explanation shadow:json state_after:json extra:json recorded_at:ts",
    "approval": "id campaign_id round_index key rule approvers_allowed:json requested_at:ts "
    "description allocation_start:ts allocation_end:ts flow_run_id decided_by decision comment "
    "overrides:json decided_at:ts require_proof:bool allow_override:bool",
    "approval_event": "id approval_id event_key decided_by decision comment overrides:json "
    "allowed:bool settled:bool recorded_at:ts proof refusal",
    "batch": "id key campaign_id round_index candidates:json backend launched_at:ts "
    "finished_at:ts status relaunch",
    "task_result": "id batch_id task_index key candidate:json status value:json objective "
    "runtime host exit_code stderr_tail attempts error_code retries:json job_id "
    "allocation_start:ts allocation_end:ts",
    "allocation": "id campaign_id job_id request state reason nodes:json node_count "
    "requested_at:ts started_at:ts ends_at:ts ended_at:ts end_reason updated_at:ts",
    "campaign_lease": "campaign_id owner token host pid acquired_at:ts heartbeat_at:ts "
    "expires_at:ts released:bool",
    "input_pin": "id campaign_id revision name file sha256 recorded_at:ts",
    "campaign_event": "id campaign_id kind flow_run_id actor details:json recorded_at:ts",
    "run_ending": "id campaign_id flow_run_id status code recorded_at:ts",
    "candidate_fate": "id campaign_id round_index call_index source candidate_index "
    "candidate:json fate rule actor reason recorded_at:ts",
}


def table_columns(table: str) -> list[tuple[str, str]]:
    """Return ``table``'s ``(column, kind)`` pairs in order (kind '' for plain values)."""
    return [
        (name, kind) for name, _, kind in (spec.partition(":") for spec in COLUMNS[table].split())
    ]


def _kinds() -> dict[str, str]:
    kinds: dict[str, str] = {}
    for table in COLUMNS:
        for name, kind in table_columns(table):
            if kinds.setdefault(name, kind) != kind:
                raise ValueError(f"column {name!r} has two kinds: {kinds[name]!r} and {kind!r}")
    return {name: kind for name, kind in kinds.items() if kind}


# What each decoded column name holds, over every table.
KINDS: Final[dict[str, str]] = _kinds()


def columns(table: str, alias: str | None = None, *, drop: Iterable[str] = ()) -> str:
    """Return ``table``'s columns (without ``drop``) as a select list, in table order."""
    left = set(drop)
    prefix = f"{alias}." if alias else ""
    return ", ".join(f"{prefix}{name}" for name, _ in table_columns(table) if name not in left)


def _moment(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return utc(value)
    return utc(datetime.fromisoformat(value))


def _json_text(value: Any) -> Any:
    if value is None or isinstance(value, int | float):
        # A JSON column has NUMERIC affinity on SQLite: a number's text is stored as a
        # number (SQLAlchemy's SQLite JSON type hands it back as it is, too).
        return value
    return json.loads(value)


def _boolean(value: Any) -> bool | None:
    return None if value is None else bool(value)


def _same(value: Any) -> Any:
    return value


class Reader:
    """Run SQL text with ``:named`` parameters; rows come back as decoded dicts."""

    # True when the driver hands JSON columns over as text (SQLite); PostgreSQL's decodes them.
    json_as_text = True

    def _run(self, sql: str, params: dict[str, Any], *, stream: bool) -> tuple[list[str], Any]:
        raise NotImplementedError

    def _decoders(self, keys: Sequence[str]) -> list[Callable[[Any], Any]]:
        by_kind: dict[str, Callable[[Any], Any]] = {
            "json": _json_text if self.json_as_text else _same,
            "ts": _moment,
            "bool": _boolean,
        }
        return [by_kind.get(KINDS.get(key, ""), _same) for key in keys]

    def stream(self, sql: str, **params: Any) -> Iterator[dict[str, Any]]:
        """Yield the rows one by one, without holding them all in memory."""
        keys, rows = self._run(sql, params, stream=True)
        decoders = self._decoders(keys)
        for row in rows:
            yield {k: d(v) for k, d, v in zip(keys, decoders, row, strict=True)}

    def all(self, sql: str, **params: Any) -> list[dict[str, Any]]:
        """Return every row."""
        keys, rows = self._run(sql, params, stream=False)
        decoders = self._decoders(keys)
        return [{k: d(v) for k, d, v in zip(keys, decoders, row, strict=True)} for row in rows]

    def first(self, sql: str, **params: Any) -> dict[str, Any] | None:
        """Return the first row, or None."""
        found = self.all(sql, **params)
        return found[0] if found else None

    def scalars(self, sql: str, **params: Any) -> list[Any]:
        """Return each row's first column."""
        return [next(iter(row.values())) for row in self.all(sql, **params)]


class SqliteReader(Reader):
    """A reader on a stdlib ``sqlite3`` connection (the CLI's read path)."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self.connection = connection

    def _run(self, sql: str, params: dict[str, Any], *, stream: bool) -> tuple[list[str], Any]:
        cursor = self.connection.execute(sql, params)
        keys = [d[0] for d in cursor.description]
        return keys, (cursor if stream else cursor.fetchall())


class AlchemyReader(Reader):
    """A reader on a SQLAlchemy connection (the store's engine: SQLite or PostgreSQL)."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.json_as_text = connection.dialect.name == "sqlite"

    def _run(self, sql: str, params: dict[str, Any], *, stream: bool) -> tuple[list[str], Any]:
        from sqlalchemy import text

        statement = text(sql)
        if stream:
            statement = statement.execution_options(yield_per=5000)
        result = self.connection.execute(statement, params)
        return list(result.keys()), (result if stream else result.all())
