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

``prov`` builds and serialises one small document per :data:`CHUNK` items (its own
code writes every record); the records are appended to the output as they come: PROV-N line by
line, PROV-JSON through one spill file per record type, joined at the end, so
memory stays flat in the number of attempts. Anonymous relation ids (``_:idN``)
are renumbered across the whole document.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any, Final
from urllib.parse import quote

from prov.model import Namespace, ProvDocument
from prov.serializers.provjson import encode_json_container

from flows._provenance._run_graph import Action, Agent, Campaign, Input, Item, Job

TERMS: Final = Namespace("u", "urn:unattended:terms#")
_ANONYMOUS: Final = re.compile(r"^_:id\d+$")
# Items per ``prov`` document: enough to spread its per-document work, few enough
# that memory stays flat (a few hundred records).
CHUNK: Final = 200


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
        self.run: Namespace | None = None
        self.prefixes: dict[str, str] = {}
        self.document: ProvDocument | None = None
        self.pending = 0

    def _document(self) -> ProvDocument:
        document = ProvDocument()
        document.add_namespace(TERMS)
        if self.run is not None:
            document.add_namespace(self.run)
        return document

    def add(self, item: Item) -> None:
        """Write ``item``'s records."""
        if isinstance(item, Campaign):
            self.run = Namespace("run", f"urn:unattended:campaign:{quote(item.name, safe='')}:")
            self.prefixes = {TERMS.prefix: TERMS.uri, self.run.prefix: self.run.uri}
            self.provn.write("document\n")
            for prefix, uri in self.prefixes.items():
                self.provn.write(f"  prefix {prefix} <{uri}>\n")
            self.provn.write("\n")
        assert self.run is not None, "the Campaign item comes first"
        if self.document is None:
            self.document = self._document()
        _records(self.document, self.run, item)
        self.pending += 1
        if self.pending >= CHUNK:
            self._flush()

    def _flush(self) -> None:
        """Write the pending document's records and start afresh."""
        document, self.document, self.pending = self.document, None, 0
        if self.run is not None:
            # A prov Namespace caches every qualified name it made: a fresh one per
            # chunk keeps memory flat (one kept for the whole export grew with it).
            self.run = Namespace(self.run.prefix, self.run.uri)
        if document is None:
            return
        text = document.get_provn()
        # Between the 'document', prefix lines and the blank line, and 'endDocument'.
        for line in text.splitlines()[1:-1]:
            if line.strip() and not line.lstrip().startswith("prefix "):
                self.provn.write(line + "\n")
        container = encode_json_container(document)
        for kind, members in container.items():
            if kind == "prefix":
                continue
            for identifier, body in members.items():
                if _ANONYMOUS.match(identifier):
                    self.anonymous += 1
                    identifier = f"_:id{self.anonymous}"
                self._spill(kind, identifier, body)

    def _spill(self, kind: str, identifier: str, body: Any) -> None:
        spill = self.spills.get(kind)
        if spill is None:
            spill = self.spills[kind] = (self.spill_dir / f"{kind}.part").open(
                "w+", encoding="utf-8"
            )
        separator = ",\n" if self.counts.get(kind) else ""
        self.counts[kind] = self.counts.get(kind, 0) + 1
        spill.write(f"{separator}    {json.dumps(identifier)}: {json.dumps(body)}")

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


def _when(text: str | None) -> str | None:
    return text or None


def _records(document: ProvDocument, run: Namespace, item: Item) -> None:
    match item:
        case Campaign():
            ended = item.status not in ("running", "awaiting_approval")
            document.activity(
                run["campaign"],
                _when(item.created_at),
                _when(item.updated_at) if ended else None,
                {
                    "prov:type": TERMS["campaign"],
                    "prov:label": f"campaign {item.name}",
                    TERMS["status"]: item.status,
                    TERMS["error_code"]: item.error_code or "",
                    TERMS["site"]: item.site,
                    TERMS["seed"]: item.seed,
                    TERMS["code_version"]: item.code_version,
                },
            )
            spec = run["input/spec_recorded"]
            document.entity(
                spec,
                {
                    "prov:type": TERMS["spec"],
                    "prov:label": "the campaign spec as recorded (notify URLs masked)",
                    "prov:value": json.dumps(item.spec, sort_keys=True),
                },
            )
            document.used(run["campaign"], spec)
            document.agent(
                run["engine"], {"prov:type": "prov:SoftwareAgent", "prov:label": "unattended"}
            )
            document.wasAssociatedWith(run["campaign"], run["engine"])
            for tool, label in (
                ("gate", "accept gate"),
                ("verifier", "verifier"),
                ("simulation", "simulation"),
                ("approval", "approval form"),
            ):
                document.agent(run[tool], {"prov:type": "prov:SoftwareAgent", "prov:label": label})
        case Input():
            entity = run[f"input/{item.name}"]
            document.entity(
                entity,
                {
                    "prov:type": TERMS["pinned_input"],
                    "prov:label": item.file or item.name,
                    TERMS["sha256"]: item.sha256,
                    TERMS["revision"]: item.revision,
                },
            )
            document.used(run["campaign"], entity)
        case Agent():
            kind = "prov:Person" if item.kind == "person" else "prov:SoftwareAgent"
            document.agent(run[item.id], {"prov:type": kind, "prov:label": item.name})
        case Action():
            _action(document, run, item)
        case Job():
            document.entity(
                run[f"job/{item.job_id}"],
                {
                    "prov:type": TERMS["allocation"],
                    "prov:label": f"Slurm job {item.job_id}",
                    TERMS["nodes"]: " ".join(item.nodes),
                    TERMS["state"]: item.state or "",
                    TERMS["end_reason"]: item.end_reason or "",
                    TERMS["started_at"]: item.started_at or "",
                    TERMS["ended_at"]: item.ended_at or item.ends_at or "",
                },
            )


def _action(document: ProvDocument, run: Namespace, action: Action) -> None:
    activity = run[action.id]
    attributes: dict[Any, Any] = {
        "prov:type": TERMS[action.kind],
        "prov:label": action.name,
        TERMS["status"]: action.status,
    }
    for key, text in (
        ("error", action.error),
        ("description", action.description),
        ("host", action.host),
        ("slurm_job", action.job),
    ):
        if text:
            attributes[TERMS[key]] = text
    for key, number in action.properties.items():
        if isinstance(number, str | int | float) and not isinstance(number, bool):
            attributes[TERMS[key]] = number
    document.activity(activity, _when(action.start), _when(action.end), attributes)
    document.wasStartedBy(activity, starter=run[action.parent or "campaign"])
    if action.agent:
        document.wasAssociatedWith(activity, run[action.agent])
    for person in action.participants:
        document.wasAssociatedWith(
            activity, run[person], other_attributes={"prov:role": TERMS["allowed_approver"]}
        )
    for value in action.values:
        document.entity(
            run[value.id],
            {"prov:type": TERMS["value"], "prov:label": value.name, "prov:value": value.text()},
        )
    for used in action.used:
        document.used(activity, run[used])
    for generated in action.generated:
        document.wasGeneratedBy(run[generated], activity)
    if action.job:
        document.used(activity, run[f"job/{action.job}"])


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
