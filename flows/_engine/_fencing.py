"""One live run per campaign: take the lease, keep it alive, give it back.

``hold_lease`` is what ``run_campaign`` wraps a run in. It takes the campaign's
lease in one transaction (or records a ``fenced_out`` event and raises
``CampaignFenced`` when a live run holds it), renews it from a thread every
``heartbeat_seconds`` (a thread, so a round busy in synchronous code still
renews), and releases it when the run ends or suspends. A run killed without
cleanup leaves the lease to expire after ``lease_ttl_seconds``, or to be taken
at once by a run on the same host that sees the holder's process is gone.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from flows._provenance import CampaignFenced, LeaseRow, ProvenanceStore
from flows._settings import Settings
from policies import SpecInvalid

log = logging.getLogger("unattended.campaign")


@dataclass(frozen=True)
class RecoverySettings:
    """The waits of fencing and recovery; tests shorten them through the environment.

    Args:
        lease_ttl_seconds: A lease not renewed for this long has expired (5-3600).
        heartbeat_seconds: How often a live run renews its lease (0.2-600; < the TTL).
        watchdog_seconds: How often the runner's watchdog looks for orphaned runs (0.2-600).
        max_continuations: Automatic continuations in a row without progress (1-100).
    """

    lease_ttl_seconds: float = 60.0
    heartbeat_seconds: float = 10.0
    watchdog_seconds: float = 2.0
    max_continuations: int = 5

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> RecoverySettings:
        """Read ``UNATTENDED_{LEASE_TTL,HEARTBEAT,WATCHDOG}_SECONDS`` and
        ``UNATTENDED_MAX_CONTINUATIONS`` (``flows._settings``)."""
        settings = Settings.from_env(env)
        if settings.heartbeat_seconds >= settings.lease_ttl_seconds:
            raise SpecInvalid(
                "invalid setting heartbeat_seconds (environment variable "
                "UNATTENDED_HEARTBEAT_SECONDS): must be below the lease TTL",
                details={"field": "heartbeat_seconds"},
            )
        return cls(
            settings.lease_ttl_seconds,
            settings.heartbeat_seconds,
            settings.watchdog_seconds,
            settings.max_continuations,
        )


@contextlib.contextmanager
def hold_lease(
    store: ProvenanceStore, campaign: str, owner: str, settings: RecoverySettings
) -> Iterator[LeaseRow | None]:
    """Hold campaign ``campaign``'s lease for ``owner`` while the block runs.

    Yields the lease as the previous run left it (None: never taken); one not
    ``released`` means that run ended without giving it back: it was killed.

    Raises:
        CampaignFenced: a live run holds the lease (recorded as a ``fenced_out`` event;
            nothing else is written).
    """
    taken = store.acquire_lease(campaign, owner, ttl=settings.lease_ttl_seconds)
    if not taken.acquired:
        holder = taken.holder
        store.record_event(
            campaign,
            "fenced_out",
            flow_run_id=owner,
            details={"holder": holder.owner if holder else None},
        )
        raise CampaignFenced(
            f"campaign {campaign!r} is being run by {holder.owner if holder else 'another run'}; "
            "this run ends without touching it",
            details={"campaign": campaign, "holder": holder.owner if holder else None},
        )
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(settings.heartbeat_seconds):
            try:
                if not store.renew_lease(campaign, ttl=settings.lease_ttl_seconds):
                    log.warning("campaign %s: the lease was taken over; stopping", campaign)
                    return
            except Exception as exc:  # noqa: BLE001  # a disk hiccup must not kill the heartbeat
                log.warning("campaign %s: lease renewal failed (%s)", campaign, type(exc).__name__)

    heartbeat = threading.Thread(target=renew, name=f"lease-{campaign}", daemon=True)
    heartbeat.start()
    try:
        yield taken.holder
    finally:
        stop.set()
        heartbeat.join(timeout=5)
        with contextlib.suppress(Exception):  # a full disk: the lease then simply expires
            store.release_lease(campaign)
