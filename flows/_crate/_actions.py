"""The crate's actions: each graph action as ``rocrate`` entities, appended as they come.

Part of ``export --format ro-crate`` (:mod:`flows._crate`): an
:class:`ActionWriter` turns each :class:`~flows._provenance._run_graph.Action` into its
``CreateAction`` (or ``CreateAction`` + ``AssessAction`` for decisions and approvals),
the ``PropertyValue`` entities of its values, its ``Place`` (node and Slurm job) on
first use and its ``ControlAction``, and writes each entity to the graph file at once,
so no list of actions is held.
"""

from __future__ import annotations

import json
from typing import IO, Any, Final

from rocrate.rocrate import ROCrate

from flows._provenance._run_graph import TOOL_OF, Action, Job

STATUS: Final = {
    "completed": "http://schema.org/CompletedActionStatus",
    "failed": "http://schema.org/FailedActionStatus",
    "active": "http://schema.org/ActiveActionStatus",
}
_ASSESSED: Final = frozenset({"decision", "approval", "approval_event"})


def ref(identifier: str) -> dict[str, str]:
    return {"@id": identifier}


def refs(identifiers: list[str]) -> Any:
    """Return references to ``identifiers``: one value, or a list of several (RO-Crate 1.1)."""
    refs = [ref(i) for i in identifiers]
    return refs[0] if len(refs) == 1 else refs


def local_id(graph_id: str) -> str:
    """Return the crate id of a graph id (``round/0/call/1`` -> ``#round/0/call/1``)."""
    return f"#{graph_id}"


def agent_id(graph_id: str) -> str:
    return f"#{graph_id}" if graph_id.startswith("person/") else f"#tool/{graph_id}"


def _duration(seconds: Any) -> str | None:
    if isinstance(seconds, int | float) and not isinstance(seconds, bool):
        return f"PT{max(float(seconds), 0.0):.6f}S"
    return None


class ActionWriter:
    """Append each action's entities to the crate's graph file as they come."""

    def __init__(self, crate: ROCrate, graph: IO[str], controls: IO[str]) -> None:
        self.crate = crate
        self.graph = graph
        self.controls = controls
        self.kinds: set[str] = set()
        self.tools: set[str] = set()
        self.places: set[str] = set()
        self.count = 0

    def emit(self, identifier: str, properties: dict[str, Any]) -> None:
        """Append one entity: what ``ContextEntity(...).properties()`` gives, built directly.

        The properties here hold plain values and ``{"@id": ...}`` references only, for
        which rocrate's entity adds nothing but ``@id`` and a default ``@type`` in front;
        building one per entity was a third of a 1,000-round crate's time.
        """
        entity = {"@id": identifier, "@type": "Thing"} | properties
        self.graph.write(",\n" + json.dumps(entity, ensure_ascii=False))
        self.count += 1

    def action(self, action: Action) -> None:
        own = local_id(action.id)
        tool = f"#tool/{TOOL_OF[action.kind]}"
        self.kinds.add(action.kind)
        self.tools.add(TOOL_OF[action.kind])
        assessed = action.kind in _ASSESSED
        properties: dict[str, Any] = {
            # A decision or an answer produces an outcome (a CreateAction, which the
            # profile's ControlAction needs) and is an assessment.
            "@type": ["CreateAction", "AssessAction"] if assessed else "CreateAction",
            "name": action.name,
            "instrument": ref(tool),
            "actionStatus": ref(STATUS[action.status]),
        }
        optional = {
            "startTime": action.start,
            "endTime": action.end,
            "error": action.error,
            "description": action.description,
            "identifier": action.properties.get("identifier"),
            "duration": _duration(action.properties.get("duration")),
        }
        properties.update({k: v for k, v in optional.items() if v})
        if action.agent:
            properties["agent"] = ref(agent_id(action.agent))
        if action.participants:
            properties["participant"] = refs([agent_id(p) for p in action.participants])
        if action.used:
            properties["object"] = refs([local_id(v) for v in action.used])
        if action.generated:
            properties["result"] = refs([local_id(v) for v in action.generated])
        if action.host or action.job:
            properties["location"] = ref(self._place(action.host, action.job))
        self.emit(own, properties)
        for value in action.values:
            self.emit(
                local_id(value.id),
                {"@type": "PropertyValue", "name": value.name, "value": value.text()},
            )
        control = f"#control/{action.id}"
        self.emit(
            control,
            {
                "@type": "ControlAction",
                "name": f"orchestrate {action.name}",
                "instrument": ref(f"#step/{action.kind}"),
                "object": ref(own),
                "actionStatus": ref(STATUS[action.status]),
            },
        )
        self.controls.write(control + "\n")

    def _place(self, host: str | None, job: str | None) -> str:
        """Return the Place of a task: its node (host) in its Slurm job, made on first use."""
        job_place = f"#slurm-job/{job}" if job else None
        node = f"{job_place or '#host'}/{host or 'unknown'}"
        if node not in self.places:
            self.places.add(node)
            properties: dict[str, Any] = {"@type": "Place", "name": host or "unknown node"}
            if job_place:
                properties["containedInPlace"] = ref(job_place)
            self.emit(node, properties)
        return node

    def job(self, job: Job) -> None:
        place = f"#slurm-job/{job.job_id}"
        self.places.add(place)
        times = ", ".join(
            f"{label} {value}"
            for label, value in (
                ("requested", job.requested_at),
                ("started", job.started_at),
                ("planned end", job.ends_at),
                ("ended", job.ended_at),
            )
            if value
        )
        self.emit(
            place,
            {
                "@type": "Place",
                "name": f"Slurm job {job.job_id}",
                "identifier": job.job_id,
                "description": (
                    f"allocation request {job.request}: state {job.state or '-'}, "
                    f"end reason {job.end_reason or '-'}, nodes {' '.join(job.nodes) or '-'}"
                    + (f"; {times}" if times else "")
                ),
            },
        )
