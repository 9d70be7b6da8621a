"""What the round engine needs of its store: the ``CampaignStore`` protocol.

The engine reads its checkpoint from the store and records every step in it
(gate calls and attempts, decisions, approvals, batches, the round's
checkpoint). :class:`flows._provenance.ProvenanceStore` is the one real
implementation; the protocol lets the engine type-check against exactly the
calls it makes, and nothing else of the store (readers, exports, migrations).

Every write is idempotent on its natural key, so a replay from the top records
nothing twice: that is part of the contract, not of this one implementation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from flows._provenance import (
    ApprovalRow,
    CampaignStatus,
    CandidateFateRecord,
    Checkpoint,
    GateCallEnd,
    TaskResultRecord,
)


class SimulationResult(Protocol):
    """What the engine reads of one simulation's result (``tasks.TaskResult`` or its record)."""

    @property
    def index(self) -> int:
        """Position of the candidate in its batch."""
        ...

    @property
    def status(self) -> str:
        """``done``, ``failed``, ``timeout`` or ``cancelled``."""
        ...

    @property
    def value(self) -> Any:
        """The JSON value the simulation produced."""
        ...


class CampaignStore(Protocol):
    """The provenance store as the round engine sees it (the checkpoint is the record)."""

    def load_checkpoint(self, name: str) -> Checkpoint:
        """Return where campaign ``name`` stands (nothing done yet if it is unknown)."""
        ...

    def set_campaign_status(
        self,
        name: str,
        status: CampaignStatus,
        error_code: str | None = None,
        *,
        round_index: int | None = None,
    ) -> None:
        """Set the campaign's status and, for a stopped run, its stable error code.

        With ``round_index``, a stopped or waiting round takes the same status in
        the same transaction.
        """
        ...

    def record_gate_call(
        self,
        name: str,
        index: int,
        call_index: int,
        *,
        gate: str,
        budget: int,
        fallback_hash: str | None,
        fallback_value: Any,
        round_started_at: datetime | None = None,
    ) -> int:
        """Record a gate call with its fallback, before any attempt; return its id.

        The round is recorded too (started at ``round_started_at``) unless it is.
        """
        ...

    def attempts(self, gate_call_id: int) -> list[dict[str, Any]]:
        """Return the attempts recorded for a gate call, by number."""
        ...

    def record_attempt(self, gate_call_id: int, attempt: Any) -> None:
        """Record one ``acceptance.Attempt`` (idempotent on its number)."""
        ...

    def finish_gate_call(
        self,
        gate_call_id: int,
        disposition: str,
        attempts_used: int,
        *,
        attempts: Iterable[Any] = (),
    ) -> None:
        """Record how the gate call ended, with its attempts not recorded yet, in one go."""
        ...

    def record_decision(
        self,
        name: str,
        index: int,
        seq: int,
        record: Mapping[str, Any],
        *,
        gate_call: GateCallEnd | None = None,
        call_index: int | None = None,
        fates: Iterable[CandidateFateRecord] = (),
    ) -> None:
        """Record the round's policy decision number ``seq``, in one transaction with
        the end of the gate call it decided on and gate call ``call_index``'s fates."""
        ...

    def record_candidate_fates(
        self, name: str, index: int, call_index: int, fates: Iterable[CandidateFateRecord]
    ) -> None:
        """Record what became of gate call ``call_index``'s candidates (first fate stands)."""
        ...

    def find_approval(self, key: str) -> ApprovalRow | None:
        """Return approval ``key`` with its events, or None if it was never requested."""
        ...

    def record_approval_request(
        self,
        name: str,
        index: int,
        *,
        key: str,
        rule: str | None,
        approvers: Iterable[str],
        description: str | None,
        flow_run_id: str | None,
        allocation_start: datetime | None = None,
        allocation_end: datetime | None = None,
        require_proof: bool | None = None,
        allow_override: bool | None = None,
    ) -> None:
        """Persist an approval request before the run suspends (idempotent on ``key``)."""
        ...

    def record_approval_event(
        self,
        key: str,
        *,
        decided_by: str | None,
        decision: str,
        comment: str | None = None,
        overrides: Any = None,
        allowed: bool,
        event_key: str | None = None,
        proof: str | None = None,
        refusal: str | None = None,
    ) -> bool:
        """Record one answer to approval ``key``; return True if it settled the request."""
        ...

    def decisions(self, name: str, index: int) -> list[dict[str, Any]]:
        """Return round ``index``'s recorded policy decisions, by seq."""
        ...

    def record_event(
        self,
        name: str,
        kind: str,
        *,
        flow_run_id: str | None = None,
        actor: str | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        """Record one campaign-level event (fenced out, inputs revised, a mismatch, ...)."""
        ...

    def find_batch(self, key: str) -> Sequence[TaskResultRecord] | None:
        """Return a finished batch's recorded results, or None if it has not finished."""
        ...

    def record_batch_launched(
        self,
        key: str,
        *,
        campaign: str,
        round_index: int,
        candidates: Iterable[Any],
        backend: str,
        relaunch: int = 0,
    ) -> None:
        """Record that batch ``key`` was launched (idempotent); ``relaunch`` > 0 for relaunches."""
        ...

    def record_batch_results(self, key: str, results: Iterable[Any]) -> None:
        """Record batch ``key``'s results and mark it finished, in one transaction."""
        ...

    def checkpoint_round(
        self,
        name: str,
        index: int,
        *,
        surrogate_state: Any,
        policy_state: Any,
        planner_state: Any,
        status: str,
    ) -> None:
        """Finish round ``index`` with its states, in one transaction."""
        ...


class AsyncCampaignStore(Protocol):
    """:class:`CampaignStore` awaited: the store as the engine calls it (``StoreThread``).

    Each method is the same call, with the same arguments, result and exceptions,
    run off the event loop in the order the engine issues it.
    """

    @property
    def blocking(self) -> CampaignStore:
        """The same store for a caller that cannot await: each call waits for its turn."""
        ...

    async def load_checkpoint(self, name: str) -> Checkpoint:
        """Awaited :meth:`CampaignStore.load_checkpoint`."""
        ...

    async def set_campaign_status(
        self,
        name: str,
        status: CampaignStatus,
        error_code: str | None = None,
        *,
        round_index: int | None = None,
    ) -> None:
        """Awaited :meth:`CampaignStore.set_campaign_status`."""
        ...

    async def record_gate_call(
        self,
        name: str,
        index: int,
        call_index: int,
        *,
        gate: str,
        budget: int,
        fallback_hash: str | None,
        fallback_value: Any,
        round_started_at: datetime | None = None,
    ) -> int:
        """Awaited :meth:`CampaignStore.record_gate_call`."""
        ...

    async def attempts(self, gate_call_id: int) -> list[dict[str, Any]]:
        """Awaited :meth:`CampaignStore.attempts`."""
        ...

    async def record_attempt(self, gate_call_id: int, attempt: Any) -> None:
        """Awaited :meth:`CampaignStore.record_attempt`."""
        ...

    async def finish_gate_call(
        self,
        gate_call_id: int,
        disposition: str,
        attempts_used: int,
        *,
        attempts: Iterable[Any] = (),
    ) -> None:
        """Awaited :meth:`CampaignStore.finish_gate_call`."""
        ...

    async def record_decision(
        self,
        name: str,
        index: int,
        seq: int,
        record: Mapping[str, Any],
        *,
        gate_call: GateCallEnd | None = None,
        call_index: int | None = None,
        fates: Iterable[CandidateFateRecord] = (),
    ) -> None:
        """Awaited :meth:`CampaignStore.record_decision`."""
        ...

    async def record_candidate_fates(
        self, name: str, index: int, call_index: int, fates: Iterable[CandidateFateRecord]
    ) -> None:
        """Awaited :meth:`CampaignStore.record_candidate_fates`."""
        ...

    async def find_approval(self, key: str) -> ApprovalRow | None:
        """Awaited :meth:`CampaignStore.find_approval`."""
        ...

    async def record_approval_request(
        self,
        name: str,
        index: int,
        *,
        key: str,
        rule: str | None,
        approvers: Iterable[str],
        description: str | None,
        flow_run_id: str | None,
        allocation_start: datetime | None = None,
        allocation_end: datetime | None = None,
        require_proof: bool | None = None,
        allow_override: bool | None = None,
    ) -> None:
        """Awaited :meth:`CampaignStore.record_approval_request`."""
        ...

    async def record_approval_event(
        self,
        key: str,
        *,
        decided_by: str | None,
        decision: str,
        comment: str | None = None,
        overrides: Any = None,
        allowed: bool,
        event_key: str | None = None,
        proof: str | None = None,
        refusal: str | None = None,
    ) -> bool:
        """Awaited :meth:`CampaignStore.record_approval_event`."""
        ...

    async def decisions(self, name: str, index: int) -> list[dict[str, Any]]:
        """Awaited :meth:`CampaignStore.decisions`."""
        ...

    async def record_event(
        self,
        name: str,
        kind: str,
        *,
        flow_run_id: str | None = None,
        actor: str | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        """Awaited :meth:`CampaignStore.record_event`."""
        ...

    async def find_batch(self, key: str) -> Sequence[TaskResultRecord] | None:
        """Awaited :meth:`CampaignStore.find_batch`."""
        ...

    async def record_batch_launched(
        self,
        key: str,
        *,
        campaign: str,
        round_index: int,
        candidates: Iterable[Any],
        backend: str,
        relaunch: int = 0,
    ) -> None:
        """Awaited :meth:`CampaignStore.record_batch_launched`."""
        ...

    async def record_batch_results(self, key: str, results: Iterable[Any]) -> None:
        """Awaited :meth:`CampaignStore.record_batch_results`."""
        ...

    async def checkpoint_round(
        self,
        name: str,
        index: int,
        *,
        surrogate_state: Any,
        policy_state: Any,
        planner_state: Any,
        status: str,
    ) -> None:
        """Awaited :meth:`CampaignStore.checkpoint_round`."""
        ...
