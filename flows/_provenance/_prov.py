"""Write a campaign's graph as W3C PROV: PROV-JSON and PROV-N, streamed (``export --format prov``).

The graph is :mod:`flows._provenance._run_graph`'s, item by item, mapped as:

* the campaign run, each round, gate call, attempt, verifier run and task, policy
  decision, approval and approval answer, and simulation task is an **activity**
  (``prov:type`` ``u:<kind>``, ``u:status``, start and end times) started by the one
  it belongs to (``wasStartedBy``);
* the planner, the policy, the verifier, the simulation, the gate, the engine and
  every approver are **agents** (``wasAssociatedWith``; an approval's allowed
  approvers with ``prov:role`` ``u:allowed_approver``);
* the pinned inputs (with ``u:sha256``), each proposal, candidate, result, fallback
  hash, decision outcome and approval decision are **entities** (``prov:value``),
  ``used`` and ``wasGeneratedBy`` the activities.

The records are written directly, as text, in the form the ``prov`` library (3.x)
gives them: the same PROV-N (local parts escaped, literals typed, times as
``xsd:dateTime``: ``flows._provenance._prov_text``) and the same PROV-JSON, byte
for byte. Building ``prov``'s documents
to serialise them took nearly all of an export's time (some 13 s for 1,000 rounds);
``prov`` stays what the tests read the files back with and compare them to
(``tests/provenance/test_prov_writer.py``).

The records of :data:`CHUNK` items are kept together, then appended to the output:
PROV-N as they are, PROV-JSON through one spill file per record type, joined at the
end, so memory stays flat in the number of attempts. The export once gave ``prov``
one document per chunk, and its PROV-JSON still reads as if it had: anonymous
relation ids (``_:idN``) are numbered across the whole document, chunk by chunk and,
within one, by record type; a record that comes twice in a chunk (same id, or an
anonymous relation with the same attributes) is written once, as a list.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Final
from urllib.parse import quote

from flows._provenance._prov_text import (
    PROV_LABEL,
    PROV_ROLE,
    PROV_TYPE,
    PROV_VALUE,
    Attributes,
    Name,
    literal,
    run_name,
    term,
    xsd_time,
)
from flows._provenance._run_graph import Action, Agent, Campaign, Input, Item, Job

TERMS_URI: Final = "urn:unattended:terms#"
# Items per chunk: fixes how anonymous ids are numbered and duplicates grouped (above).
CHUNK: Final = 200


class _Chunk:
    """The records of up to :data:`CHUNK` items: PROV-N lines, PROV-JSON members by type.

    A member is keyed by its id (a JSON string) or, for an anonymous relation, by a
    1-tuple of its body: prov gives equal anonymous relations one id.
    """

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.members: dict[str, dict[str | tuple[str], list[str]]] = {}

    def _keep(self, kind: str, key: str | tuple[str], arguments: str, body: str) -> None:
        """Keep the record ``kind(arguments)`` and its PROV-JSON ``body``, under ``key``."""
        self.lines.append(f"  {kind}({arguments})\n")
        self.members.setdefault(kind, {}).setdefault(key, []).append(body)

    def _element(
        self,
        kind: str,
        identifier: Name,
        attributes: Attributes,
        times: tuple[tuple[str, Name | None], ...] = (),
    ) -> None:
        """Keep the element ``kind(identifier, times..., [attributes])``.

        ``times`` are (PROV-JSON key, time) pairs; an absent time is ``-`` in PROV-N.
        """
        arguments = [identifier.provn]
        body = []
        for key, time in times:
            arguments.append("-" if time is None else time.provn)
            if time is not None:
                body.append(f"{key}: {time.json}")
        extra = []
        for attribute, given in attributes.items():
            if given is not None:
                text, encoded = literal(given)
                extra.append(f"{attribute.provn}={text}")
                body.append(f"{attribute.json}: {encoded}")
        if extra:
            arguments.append(f"[{', '.join(extra)}]")
        self._keep(kind, identifier.json, ", ".join(arguments), "{" + ", ".join(body) + "}")

    def _relation(self, kind: str, arguments: str, body: str) -> None:
        """Keep an anonymous relation (no time, trigger or plan: ``-`` in PROV-N)."""
        self._keep(kind, (body,), arguments, body)

    def entity(self, identifier: Name, attributes: Attributes) -> None:
        """Keep ``entity(identifier, [attributes])``."""
        self._element("entity", identifier, attributes)

    def agent(self, identifier: Name, attributes: Attributes) -> None:
        """Keep ``agent(identifier, [attributes])``."""
        self._element("agent", identifier, attributes)

    def activity(
        self, identifier: Name, start: Name | None, end: Name | None, attributes: Attributes
    ) -> None:
        """Keep ``activity(identifier, start, end, [attributes])``."""
        times = (('"prov:startTime"', start), ('"prov:endTime"', end))
        self._element("activity", identifier, attributes, times)

    def used(self, activity: Name, entity: Name) -> None:
        """Keep ``used(activity, entity, -)``."""
        self._relation(
            "used",
            f"{activity.provn}, {entity.provn}, -",
            f'{{"prov:activity": {activity.json}, "prov:entity": {entity.json}}}',
        )

    def generated_by(self, entity: Name, activity: Name) -> None:
        """Keep ``wasGeneratedBy(entity, activity, -)``."""
        self._relation(
            "wasGeneratedBy",
            f"{entity.provn}, {activity.provn}, -",
            f'{{"prov:entity": {entity.json}, "prov:activity": {activity.json}}}',
        )

    def started_by(self, activity: Name, starter: Name) -> None:
        """Keep ``wasStartedBy(activity, -, starter, -)``: no trigger entity."""
        self._relation(
            "wasStartedBy",
            f"{activity.provn}, -, {starter.provn}, -",
            f'{{"prov:activity": {activity.json}, "prov:starter": {starter.json}}}',
        )

    def associated_with(self, activity: Name, agent: Name, role: Name | None = None) -> None:
        """Keep ``wasAssociatedWith(activity, agent, -)``, with ``[prov:role=role]`` if given."""
        arguments = f"{activity.provn}, {agent.provn}, -"
        body = f'"prov:activity": {activity.json}, "prov:agent": {agent.json}'
        if role is not None:
            text, encoded = literal(role)
            arguments += f", [{PROV_ROLE.provn}={text}]"
            body += f", {PROV_ROLE.json}: {encoded}"
        self._relation("wasAssociatedWith", arguments, "{" + body + "}")


def provn_name(target: Path) -> Path:
    """Return the PROV-N file written for ``--out target``: ``<stem>.provn``."""
    return _stem(target).with_name(_stem(target).name + ".provn")


def provjson_name(target: Path) -> Path:
    """Return the PROV-JSON file written for ``--out target``: ``<stem>.prov.json``."""
    return _stem(target).with_name(_stem(target).name + ".prov.json")


def _stem(target: Path) -> Path:
    name = target.name
    for suffix in (".prov.json", ".provn", ".json"):
        if name.endswith(suffix) and len(name) > len(suffix):
            return target.with_name(name[: -len(suffix)])
    return target


class ProvWriter:
    """Append the graph's items to a PROV-N file and a PROV-JSON file as they come.

    Call :meth:`add` for every item (the :class:`Campaign` first), then
    :meth:`finish`, which joins PROV-JSON's per-type spill files into ``json_path``.
    """

    def __init__(self, provn: IO[str], json_path: Path, spill_dir: Path) -> None:
        self.provn = provn
        self.json_path = json_path
        self.spill_dir = spill_dir
        self.spills: dict[str, IO[str]] = {}
        self.counts: dict[str, int] = {}
        self.anonymous = 0
        self.prefixes: dict[str, str] = {}
        self.chunk = _Chunk()
        self.pending = 0

    def add(self, item: Item) -> None:
        """Write ``item``'s records."""
        if isinstance(item, Campaign):
            run = f"urn:unattended:campaign:{quote(item.name, safe='')}:"
            self.prefixes = {"u": TERMS_URI, "run": run}
            self.provn.write("document\n")
            for prefix, uri in self.prefixes.items():
                self.provn.write(f"  prefix {prefix} <{uri}>\n")
            self.provn.write("\n")
        assert self.prefixes, "the Campaign item comes first"
        _records(self.chunk, item)
        self.pending += 1
        if self.pending >= CHUNK:
            self._flush()

    def _flush(self) -> None:
        """Write the chunk's records and start afresh."""
        chunk, self.chunk, self.pending = self.chunk, _Chunk(), 0
        self.provn.write("".join(chunk.lines))
        for kind, members in chunk.members.items():
            entries = []
            for key, bodies in members.items():
                if isinstance(key, tuple):  # numbered as the chunk's prov document had it
                    self.anonymous += 1
                    identifier = f'"_:id{self.anonymous}"'
                else:
                    identifier = key
                body = bodies[0] if len(bodies) == 1 else f"[{', '.join(bodies)}]"
                entries.append(f"    {identifier}: {body}")
            self._spill(kind, entries)

    def _spill(self, kind: str, entries: list[str]) -> None:
        """Append PROV-JSON members (``"id": body``) to ``kind``'s spill file."""
        spill = self.spills.get(kind)
        if spill is None:
            spill = self.spills[kind] = (self.spill_dir / f"{kind}.part").open(
                "w+", encoding="utf-8"
            )
        if self.counts.get(kind):
            spill.write(",\n")
        self.counts[kind] = self.counts.get(kind, 0) + len(entries)
        spill.write(",\n".join(entries))

    def finish(self) -> None:
        """Close the PROV-N document and join the PROV-JSON file."""
        self._flush()
        self.provn.write("endDocument\n")
        with self.json_path.open("w", encoding="utf-8") as out:
            out.write('{\n  "prefix": ' + json.dumps(self.prefixes))
            for kind, spill in self.spills.items():
                out.write(f",\n  {json.dumps(kind)}: {{\n")
                spill.seek(0)
                while chunk := spill.read(1 << 20):
                    out.write(chunk)
                spill.close()
                out.write("\n  }")
            out.write("\n}\n")


def _records(chunk: _Chunk, item: Item) -> None:
    """Keep ``item``'s records (see the module doc for the mapping)."""
    match item:
        case Campaign():
            ended = item.status not in ("running", "awaiting_approval")
            campaign = run_name("campaign")
            chunk.activity(
                campaign,
                xsd_time(item.created_at),
                xsd_time(item.updated_at) if ended else None,
                {
                    PROV_TYPE: term("campaign"),
                    PROV_LABEL: f"campaign {item.name}",
                    term("status"): item.status,
                    term("error_code"): item.error_code or "",
                    term("site"): item.site,
                    term("seed"): item.seed,
                    term("code_version"): item.code_version,
                },
            )
            spec = run_name("input/spec_recorded")
            chunk.entity(
                spec,
                {
                    PROV_TYPE: term("spec"),
                    PROV_LABEL: "the campaign spec as recorded (notify URLs masked)",
                    PROV_VALUE: json.dumps(item.spec, sort_keys=True),
                },
            )
            chunk.used(campaign, spec)
            # prov:SoftwareAgent and prov:Person are written as strings, not names, as
            # they always were.
            engine = run_name("engine")
            chunk.agent(engine, {PROV_TYPE: "prov:SoftwareAgent", PROV_LABEL: "unattended"})
            chunk.associated_with(campaign, engine)
            for tool, label in (
                ("gate", "accept gate"),
                ("verifier", "verifier"),
                ("simulation", "simulation"),
                ("approval", "approval form"),
            ):
                chunk.agent(run_name(tool), {PROV_TYPE: "prov:SoftwareAgent", PROV_LABEL: label})
        case Input():
            entity = run_name(f"input/{item.name}")
            chunk.entity(
                entity,
                {
                    PROV_TYPE: term("pinned_input"),
                    PROV_LABEL: item.file or item.name,
                    term("sha256"): item.sha256,
                    term("revision"): item.revision,
                },
            )
            chunk.used(run_name("campaign"), entity)
        case Agent():
            kind = "prov:Person" if item.kind == "person" else "prov:SoftwareAgent"
            chunk.agent(run_name(item.id), {PROV_TYPE: kind, PROV_LABEL: item.name})
        case Action():
            _action(chunk, item)
        case Job():
            chunk.entity(
                run_name(f"job/{item.job_id}"),
                {
                    PROV_TYPE: term("allocation"),
                    PROV_LABEL: f"Slurm job {item.job_id}",
                    term("nodes"): " ".join(item.nodes),
                    term("state"): item.state or "",
                    term("end_reason"): item.end_reason or "",
                    term("started_at"): item.started_at or "",
                    term("ended_at"): item.ended_at or item.ends_at or "",
                },
            )


def _action(chunk: _Chunk, action: Action) -> None:
    """Keep an action's activity, its relations and the values it introduces."""
    activity = run_name(action.id)
    attributes: Attributes = {
        PROV_TYPE: term(action.kind),
        PROV_LABEL: action.name,
        term("status"): action.status,
    }
    for key, text in (
        ("error", action.error),
        ("description", action.description),
        ("host", action.host),
        ("slurm_job", action.job),
    ):
        if text:
            attributes[term(key)] = text
    for key, number in action.properties.items():
        if isinstance(number, str | int | float) and not isinstance(number, bool):
            attributes[term(key)] = number
    chunk.activity(activity, xsd_time(action.start), xsd_time(action.end), attributes)
    chunk.started_by(activity, run_name(action.parent or "campaign"))
    if action.agent:
        chunk.associated_with(activity, run_name(action.agent))
    for person in action.participants:
        chunk.associated_with(activity, run_name(person), role=term("allowed_approver"))
    for value in action.values:
        chunk.entity(
            run_name(value.id),
            {PROV_TYPE: term("value"), PROV_LABEL: value.name, PROV_VALUE: value.text()},
        )
    for used in action.used:
        chunk.used(activity, run_name(used))
    for generated in action.generated:
        chunk.generated_by(run_name(generated), activity)
    if action.job:
        chunk.used(activity, run_name(f"job/{action.job}"))


def write_prov(items: Iterable[Item], provn_path: Path, json_path: Path) -> dict[str, int]:
    """Write ``items`` as PROV-N and PROV-JSON; return the records written per PROV-JSON type."""
    with (
        tempfile.TemporaryDirectory(prefix=".prov-", dir=json_path.parent) as spill,
        provn_path.open("w", encoding="utf-8") as provn,
    ):
        writer = ProvWriter(provn, json_path, Path(spill))
        for item in items:
            writer.add(item)
        writer.finish()
        return dict(writer.counts)
