"""The read model: every query the provenance readers run, as SQL text.

Plain SQL with ``:named`` parameters, valid on SQLite and PostgreSQL, run by a
:class:`~flows._provenance._sql.Reader` (stdlib ``sqlite3`` or SQLAlchemy). Select
lists of whole rows come from :func:`~flows._provenance._sql.columns`, in table
order, so a record's fields keep the schema's order. Used by ``_readers`` and
``_export``; nothing else writes SQL for reading.
"""

# The select lists are built from the constant column map (``_sql.COLUMNS``), never
# from input; every value is a bound :named parameter.
# ruff: noqa: S608

from __future__ import annotations

from typing import Final

from flows._provenance._sql import columns

CAMPAIGN_ID: Final = "SELECT id FROM campaign WHERE name = :name"
CAMPAIGN: Final = f"SELECT {columns('campaign', drop=('id',))} FROM campaign WHERE id = :cid"
ROUND_STATUSES: Final = (
    "SELECT round_index, status FROM round WHERE campaign_id = :cid ORDER BY round_index"
)
ROUND_STATES: Final = (
    "SELECT policy_state, planner_state FROM round "
    "WHERE campaign_id = :cid AND round_index = :index"
)
SURROGATE_STATES: Final = (
    "SELECT surrogate_state FROM round WHERE campaign_id = :cid AND round_index <= :last "
    "AND status = 'completed' AND surrogate_state IS NOT NULL ORDER BY round_index"
)
LEASE: Final = (
    "SELECT owner, token, host, pid, heartbeat_at, expires_at, released "
    "FROM campaign_lease WHERE campaign_id = :cid"
)
RUN_ENDINGS: Final = (
    f"SELECT {columns('run_ending', drop=('id', 'campaign_id'))} FROM run_ending "
    "WHERE campaign_id = :cid ORDER BY id"
)
DECISION_OUTCOMES: Final = (
    "SELECT outcome FROM policy_decision WHERE campaign_id = :cid AND round_index <= :last "
    "ORDER BY round_index, seq"
)
APPROVAL: Final = (
    f"SELECT {columns('approval', 'a')}, c.name AS campaign FROM approval a "
    "JOIN campaign c ON c.id = a.campaign_id WHERE a.key = :key"
)
APPROVAL_EVENTS: Final = (
    f"SELECT {columns('approval_event')} FROM approval_event "
    "WHERE approval_id = :approval ORDER BY id"
)
TASK_RESULTS: Final = (
    f"SELECT {columns('task_result')} FROM task_result WHERE batch_id = :batch ORDER BY task_index"
)
BATCHES_IN_FLIGHT: Final = (
    "SELECT count(*) FROM batch WHERE campaign_id = :cid AND status = 'launched'"
)
BATCH_BY_KEY: Final = "SELECT id, status FROM batch WHERE key = :key"
CAMPAIGNS: Final = (
    "SELECT c.name, c.status, c.error_code, c.site, COALESCE(r.rounds, 0) AS rounds, "
    "c.created_at, c.updated_at FROM campaign c LEFT OUTER JOIN "
    "(SELECT campaign_id, count(*) AS rounds FROM round GROUP BY campaign_id) r "
    "ON r.campaign_id = c.id ORDER BY c.name"
)
GATE_CALLS: Final = (
    f"SELECT {columns('gate_call', drop=('campaign_id',))} FROM gate_call "
    "WHERE campaign_id = :cid AND round_index = :index ORDER BY call_index"
)
ATTEMPTS: Final = (
    f"SELECT {columns('attempt', drop=('id', 'gate_call_id'))} FROM attempt "
    "WHERE gate_call_id = :call ORDER BY number"
)
DECISIONS: Final = (
    f"SELECT {columns('policy_decision', drop=('id', 'campaign_id', 'round_index'))} "
    "FROM policy_decision WHERE campaign_id = :cid AND round_index = :index ORDER BY seq"
)
FATES: Final = (
    "SELECT "
    f"{columns('candidate_fate', drop=('id', 'campaign_id', 'round_index', 'recorded_at'))} "
    "FROM candidate_fate WHERE campaign_id = :cid AND round_index = :index "
    "ORDER BY call_index, source DESC, candidate_index"
)
DISPOSITIONS: Final = (
    "SELECT round_index, disposition, count(*) AS n, sum(attempts_used) AS used "
    "FROM gate_call WHERE campaign_id = :cid GROUP BY round_index, disposition"
)
PENDING_CALLS: Final = (
    "SELECT id, round_index FROM gate_call WHERE campaign_id = :cid AND disposition = 'pending'"
)
ATTEMPT_COUNT: Final = "SELECT count(*) AS n FROM attempt WHERE gate_call_id = :call"
BEST_RESULT: Final = (
    "SELECT b.round_index, b.key AS batch, t.task_index, t.key, t.objective, t.value, "
    "t.candidate FROM batch b JOIN task_result t ON t.batch_id = b.id "
    "WHERE b.campaign_id = :cid AND t.status = 'done' AND t.objective IS NOT NULL "
    "ORDER BY t.objective, b.round_index, t.task_index LIMIT 1"
)
OUTCOMES: Final = (
    "SELECT round_index, outcome, seq FROM policy_decision WHERE campaign_id = :cid ORDER BY seq"
)
# An interrupted task (its allocation ended) is relaunched in a later batch of the
# round, whose result is the candidate's: it counts apart, as an interruption.
ROUND_TASKS: Final = (
    "SELECT b.round_index, "
    "sum(CASE WHEN t.status != 'interrupted' THEN 1 ELSE 0 END) AS n, "
    "sum(CASE WHEN t.status = 'interrupted' THEN 1 ELSE 0 END) AS interrupted, "
    "sum(CASE WHEN t.status = 'done' THEN 1 ELSE 0 END) AS done, "
    "min(CASE WHEN t.status = 'done' THEN t.objective END) AS best "
    "FROM batch b JOIN task_result t ON t.batch_id = b.id "
    "WHERE b.campaign_id = :cid GROUP BY b.round_index"
)
APPROVALS: Final = (
    "SELECT round_index, key, rule, approvers_allowed, decision, decided_by, decided_at "
    "FROM approval "
    "WHERE campaign_id = :cid ORDER BY round_index, id"
)
ROUNDS: Final = (
    "SELECT round_index, status, started_at, finished_at FROM round "
    "WHERE campaign_id = :cid ORDER BY round_index"
)
ROUND: Final = (
    f"SELECT {columns('round', drop=('id', 'campaign_id'))} FROM round "
    "WHERE campaign_id = :cid AND round_index = :index"
)
ROUND_APPROVAL_KEYS: Final = (
    "SELECT key FROM approval WHERE campaign_id = :cid AND round_index = :index ORDER BY id"
)
ROUND_BATCHES: Final = (
    f"SELECT {columns('batch')} FROM batch WHERE campaign_id = :cid AND round_index = :index "
    "ORDER BY id"
)
ALLOCATIONS: Final = (
    f"SELECT {columns('allocation', drop=('id', 'campaign_id'))} FROM allocation "
    "WHERE campaign_id = :cid ORDER BY request, id"
)
# How many task results each job of a campaign carried (``inspect --allocations``);
# the NULL job gathers results recorded without one (sites without batch jobs).
ALLOCATION_TASKS: Final = (
    "SELECT t.job_id, count(*) AS tasks, "
    "sum(CASE WHEN t.status = 'done' THEN 1 ELSE 0 END) AS done, "
    "sum(CASE WHEN t.status = 'interrupted' THEN 1 ELSE 0 END) AS interrupted "
    "FROM task_result t JOIN batch b ON b.id = t.batch_id "
    "WHERE b.campaign_id = :cid GROUP BY t.job_id"
)
# What a campaign has achieved so far: the watchdog counts continuations without progress.
PROGRESS: Final = (
    "SELECT (SELECT count(*) FROM round WHERE campaign_id = :cid AND status = 'completed') "
    "AS rounds, (SELECT count(*) FROM task_result t JOIN batch b ON b.id = t.batch_id "
    "WHERE b.campaign_id = :cid AND t.status != 'interrupted') AS tasks"
)

# ``unattended export``: whole records, by id (the order they were recorded in).
EXPORT_ROUNDS: Final = (
    f"SELECT {columns('round', drop=('id', 'campaign_id'))} FROM round "
    "WHERE campaign_id = :cid ORDER BY id"
)
EXPORT_DECISIONS: Final = (
    f"SELECT {columns('policy_decision', drop=('id', 'campaign_id'))} FROM policy_decision "
    "WHERE campaign_id = :cid ORDER BY id"
)
EXPORT_APPROVAL_KEYS: Final = "SELECT key FROM approval WHERE campaign_id = :cid ORDER BY id"
EXPORT_BATCHES: Final = f"SELECT {columns('batch')} FROM batch WHERE campaign_id = :cid ORDER BY id"
EXPORT_ATTEMPTS: Final = (
    "SELECT g.round_index, g.call_index, g.name AS gate, g.disposition, g.fallback_hash, "
    "a.number, a.rejected_by, a.failed_by, a.reason, a.value, a.verdicts, a.scores, a.duration, "
    "a.trace_id, a.span_id FROM gate_call g JOIN attempt a ON a.gate_call_id = g.id "
    "WHERE g.campaign_id = :cid ORDER BY g.round_index, g.call_index, a.number"
)
