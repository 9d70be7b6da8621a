"""Prefect events for automations: an approval requested, answered or expired; a campaign's end.

The engine's event hook calls :meth:`CampaignEvents.on_event`, which emits (with
``prefect.events.emit_event``, queued to Prefect's events worker: no request on the
round's path):

=================================  ==========================================================
``unattended.approval.requested``  a request waits (round, key, rule, approvers, deadline)
``unattended.approval.answered``   an allowed answer (round, key, verdict, by)
``unattended.approval.expired``    the deadline passed first (round, key)
``unattended.campaign.stopped``    blocked, escalated or failed (round, status, code)
``unattended.campaign.completed``  every round done
=================================  ==========================================================

The resource is the campaign (``unattended.campaign.<name>``); the flow run is a
related resource (role ``flow-run``), so an automation can match either. An event's
id is derived from what it says (the campaign, the event, the form's key or the
round): the run that starts again from the top after a resume says "requested" for
the same form again, and the server keeps the first. Payloads carry names, rounds,
codes and keys, never the proposal or an answer's comment or code.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any

from prefect.events import emit_event

log = logging.getLogger("unattended.events")
# The namespace of the events' ids (uuid5 of what the event says).
_IDS = uuid.UUID("2f6c3c39-5f1e-4d43-9a43-0b8a6e0c7d51")


def campaign_resource(campaign: str) -> str:
    """Return the Prefect resource id of a campaign (what an automation matches)."""
    return f"unattended.campaign.{campaign}"


class CampaignEvents:
    """The engine's event hook that emits a campaign's Prefect events (see the module)."""

    def __init__(self, campaign: str, flow_run_id: str | None) -> None:
        self.campaign = campaign
        self.flow_run_id = flow_run_id
        self._key: str | None = None  # the request waiting, for its answer's event

    def on_event(self, kind: str, data: Mapping[str, Any]) -> None:
        """Emit the Prefect event an engine event stands for, if any (never raises)."""
        try:
            found = self._event(kind, data)
            if found is not None:
                self._emit(*found)
        except Exception as exc:  # noqa: BLE001  # an event never fails the campaign
            log.warning("event for %s not emitted: %s", kind, type(exc).__name__)

    def _event(self, kind: str, data: Mapping[str, Any]) -> tuple[str, str, dict[str, Any]] | None:
        at = data.get("round")
        match kind:
            case "suspend":
                key = str(data.get("key"))
                self._key = key.rpartition("-n")[0] or key
                payload = {
                    "round": at,
                    "key": key,
                    "rule": data.get("rule"),
                    "approvers": list(data.get("approvers") or ()),
                    "deadline": data.get("deadline"),
                }
                return "unattended.approval.requested", key, payload
            case "approval":
                verdict = str(data.get("verdict"))
                key = self._key or f"{self.campaign}-r{at}"
                if verdict == "timeout":
                    return "unattended.approval.expired", key, {"round": at, "key": key}
                payload = {"round": at, "key": key, "verdict": verdict, "by": data.get("by")}
                return "unattended.approval.answered", key, payload
            case "stopped" | "failed":
                status = str(data.get("status") or kind)
                payload = {"round": at, "status": status, "code": data.get("code")}
                return "unattended.campaign.stopped", f"r{at}", payload
            case "completed":
                return "unattended.campaign.completed", "end", {"rounds": data.get("rounds")}
            case _:
                return None

    def _emit(self, name: str, about: str, payload: dict[str, Any]) -> None:
        related = []
        if self.flow_run_id:
            related.append(
                {
                    "prefect.resource.id": f"prefect.flow-run.{self.flow_run_id}",
                    "prefect.resource.role": "flow-run",
                }
            )
        emit_event(
            name,
            resource={
                "prefect.resource.id": campaign_resource(self.campaign),
                "prefect.resource.name": self.campaign,
            },
            related=related,
            payload={"campaign": self.campaign, **payload},
            id=uuid.uuid5(_IDS, f"{self.campaign}|{self.flow_run_id}|{name}|{about}"),
        )
