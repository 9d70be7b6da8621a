"""Publish a campaign run's story as Prefect artifacts, off the round's path.

The engine's event hook (``Hooks.on_event``) calls :meth:`CampaignArtifacts.on_event`;
it decides what to publish and hands the work to one background thread, which
reads the provenance (``_artifact_views``) and creates the artifacts Prefect's
``create_table_artifact``, ``create_markdown_artifact``, ``create_progress_artifact``
and ``update_progress_artifact`` make (the same types, data and keys), through one
client of its own: those functions make a client per call, and each client loads
the CA bundle again (~60 ms of CPU, measured). So a round pays for a few
dictionary operations, not for HTTP requests to a server that may be slow under
load. Every artifact names the flow run, none a task run.

Under stable keys per campaign (``artifact_key``): ``-rounds`` (a row per round,
a new version when a round ends), ``-batch`` (the batch in flight: one progress
artifact a run, updated as each round's tasks finish, at most every
``every_seconds`` and at a batch's last task), ``-approval`` (the evidence of a
waiting request, then how it was answered) and ``-summary`` (at the end). Before
the run suspends or ends, the hook waits (up to ``drain_seconds``) for the thread
to publish what is queued: the process may exit next.

An artifact that fails (server down, database busy) is logged and dropped; it never
fails or slows the campaign beyond that wait.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any
from uuid import UUID

from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.actions import ArtifactCreate, ArtifactUpdate

from flows._engine._approval import ApprovalRequest
from flows._engine._notify import chain
from flows._prefect._artifact_views import (
    RoundTable,
    answered_markdown,
    artifact_key,
    evidence_markdown,
    summary_markdown,
)
from flows._prefect._events import CampaignEvents
from flows._provenance import ProvenanceStore

log = logging.getLogger("unattended.artifacts")
_ENDS = frozenset({"completed", "stopped", "failed"})
Job = Callable[[SyncPrefectClient], None]


class _Publisher:
    """One daemon thread running queued jobs in order with one Prefect client; never raising.

    One client for the thread's life: a client made per request (what Prefect's
    ``create_*_artifact`` functions do) loads the CA bundle each time, ~60 ms of CPU.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[str, Job] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.failures = 0

    def put(self, label: str, job: Job) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="artifacts", daemon=True)
            self._thread.start()
        self._jobs.put((label, job))

    def drain(self, seconds: float) -> bool:
        """Wait until every job queued so far has run (or ``seconds`` passed)."""
        if self._thread is None:
            return True
        done = threading.Event()
        self.put("drain", lambda _client: done.set())
        return done.wait(seconds)

    def stop(self) -> None:
        """End the thread after the jobs queued so far (its client is closed)."""
        if self._thread is not None:
            self._jobs.put(None)

    def _work(self) -> None:
        client: SyncPrefectClient | None = None
        try:
            while (item := self._jobs.get()) is not None:
                label, job = item
                try:
                    if client is None:
                        client = get_client(sync_client=True)
                        client.__enter__()
                    job(client)
                except Exception as exc:  # noqa: BLE001  # an artifact never fails the campaign
                    self.failures += 1
                    log.warning("artifact %s not published: %s", label, type(exc).__name__)
        finally:
            if client is not None:
                client.__exit__(None, None, None)


class CampaignArtifacts:
    """The engine's event hook that publishes a campaign run's artifacts (see the module)."""

    def __init__(
        self,
        campaign: str,
        store: ProvenanceStore,
        flow_run_id: str | None,
        *,
        every_seconds: float = 1.0,
        drain_seconds: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.campaign = campaign
        self.store = store
        self.flow_run_id = flow_run_id
        self.every_seconds = every_seconds
        self.drain_seconds = drain_seconds
        self.clock = clock
        self.table = RoundTable(campaign)
        self.publisher = _Publisher()
        self._round: int | None = None
        self._finished = 0
        self._failed = 0
        self._said = -float("inf")
        self._progress_id: UUID | None = None
        self._request: ApprovalRequest | None = None

    def key(self, what: str) -> str:
        """Return this campaign's artifact key for ``what``."""
        return artifact_key(self.campaign, what)

    def on_event(self, kind: str, data: Mapping[str, Any]) -> None:
        """Queue what an engine event changes in the artifacts (cheap; never raises)."""
        try:
            self._on_event(kind, data)
        except Exception as exc:  # noqa: BLE001  # an artifact never fails the campaign
            log.warning("artifacts: event %s not handled: %s", kind, type(exc).__name__)

    def _on_event(self, kind: str, data: Mapping[str, Any]) -> None:
        match kind:
            case "task":
                self._task(int(data["round"]), str(data.get("status")), data.get("of"))
            case "batch":
                self.publisher.put("rounds", self._publish_table)
            case "suspend":
                request = data.get("request")
                if isinstance(request, ApprovalRequest):
                    self._request = request
                    self.publisher.put("approval", lambda c: self._publish_evidence(c, request))
                self.publisher.put("rounds", self._publish_table)
                self.publisher.drain(self.drain_seconds)  # the run suspends next
            case "approval":
                answered = self._request
                self.publisher.put(
                    "approval",
                    lambda c: self._publish_answer(
                        c,
                        answered,
                        int(data["round"]),
                        str(data.get("verdict")),
                        str(data.get("by")),
                    ),
                )
            case _ if kind in _ENDS:
                status = str(data.get("status") or kind)
                code = data.get("code")
                self.publisher.put("rounds", self._publish_table)
                self.publisher.put(
                    "summary",
                    lambda c: self._publish_summary(c, status, str(code) if code else None),
                )
                self.publisher.drain(self.drain_seconds)  # the run ends next
                self.publisher.stop()

    def _task(self, index: int, status: str, of: Any) -> None:
        if index != self._round:
            self._round, self._finished, self._failed = index, 0, 0
            self._said = -float("inf")
        if status == "interrupted":
            return  # it runs again in a relaunch: not finished
        self._finished += 1
        self._failed += status != "done"
        size = int(of) if isinstance(of, int) and of > 0 else None
        last = size is not None and self._finished >= size
        now = self.clock()
        if not last and now - self._said < self.every_seconds:
            return
        self._said = now
        finished, failed = self._finished, self._failed
        self.publisher.put(
            "batch", lambda c: self._publish_progress(c, index, finished, failed, size)
        )

    # -- in the publisher's thread -----------------------------------------------------------

    def _create(
        self, client: SyncPrefectClient, kind: str, what: str, data: Any, about: str
    ) -> UUID:
        """Create a new version of this campaign's ``what`` artifact on the flow run."""
        created = client.create_artifact(
            ArtifactCreate(
                type=kind,
                key=self.key(what),
                description=about,
                data=data,
                flow_run_id=UUID(self.flow_run_id) if self.flow_run_id else None,
            )
        )
        return created.id

    def _publish_table(self, client: SyncPrefectClient) -> None:
        rows = self.table.rows(self.store)
        about = f"Campaign `{self.campaign}`: one row per round ({len(rows)} so far)."
        self._create(client, "table", "rounds", json.dumps(rows), about)

    def _publish_progress(
        self, client: SyncPrefectClient, index: int, finished: int, failed: int, size: int | None
    ) -> None:
        of = f" of {size}" if size else ""
        about = f"Round {index}'s batch: {finished}{of} tasks finished ({failed} failed)."
        progress = min(100.0, 100.0 * finished / size) if size else 0.0
        if self._progress_id is None:  # one a run: each round's batch updates it
            self._progress_id = self._create(client, "progress", "batch", progress, about)
            return
        client.update_artifact(self._progress_id, ArtifactUpdate(data=progress, description=about))

    def _publish_evidence(self, client: SyncPrefectClient, request: ApprovalRequest) -> None:
        markdown = evidence_markdown(request, self.store, self.flow_run_id)
        about = f"Approval {request.key}: the evidence for the approver."
        self._create(client, "markdown", "approval", markdown, about)

    def _publish_answer(
        self,
        client: SyncPrefectClient,
        request: ApprovalRequest | None,
        index: int,
        verdict: str,
        by: str,
    ) -> None:
        key = request.key if request is not None else f"{self.campaign}-r{index}"
        markdown = answered_markdown(key, index, verdict, by)
        self._create(client, "markdown", "approval", markdown, f"Approval {key}: {verdict}.")

    def _publish_summary(self, client: SyncPrefectClient, status: str, code: str | None) -> None:
        markdown = summary_markdown(self.store, self.campaign, status, code)
        self._create(
            client, "markdown", "summary", markdown, f"Campaign `{self.campaign}`: {status}."
        )


def ui_observer(
    campaign: str, store: ProvenanceStore, flow_run_id: str | None
) -> Callable[[str, Mapping[str, Any]], None]:
    """Return the event hook that tells the Prefect UI a run's story: its artifacts and events."""
    artifacts = CampaignArtifacts(campaign, store, flow_run_id)
    return chain(CampaignEvents(campaign, flow_run_id).on_event, artifacts.on_event)
