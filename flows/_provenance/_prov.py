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
``xsd:dateTime``) and the same PROV-JSON, byte for byte. Building ``prov``'s documents
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

import functools
import json
import math
import re
import tempfile
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from json.encoder import encode_basestring_ascii
from pathlib import Path
from typing import IO, Final, NamedTuple
from urllib.parse import quote

from flows._provenance._run_graph import Action, Agent, Campaign, Input, Item, Job

TERMS_URI: Final = "urn:unattended:terms#"
# Items per chunk: fixes how anonymous ids are numbered and duplicates grouped (above).
CHUNK: Final = 200

# PROV-N's PN_LOCAL (productions [53]-[55]), with the character classes prov spells
# in ``prov/identifier.py``: the XML NCName characters less '.', the characters that
# may follow but not start a local part, those allowed as they are, and the
# metacharacters written with a backslash.
_PN_CHARS_U: Final = (
    "A-Z_a-z\xc0-\xd6\xd8-\xf6\xf8-\u02ff\u0370-\u037d\u037f-\u1fff\u200c-\u200d"
    "\u2070-\u218f\u2c00-\u2fef\u3001-\ud7ff\uf900-\ufdcf\ufdf0-\ufffd\U00010000-\U000effff"
)
_NOT_FIRST: Final = "\xb7\u0300-\u036f\u203f-\u2040"
_METACHARACTERS: Final = "='(),:;[]"
_WRITABLE: Final = _PN_CHARS_U + "\\-0-9" + _NOT_FIRST + re.escape(f"/@~&+*?#$!{_METACHARACTERS}-.")
_BAD_FIRST: Final = re.compile(f"[{_NOT_FIRST}]")
_UNWRITABLE: Final = re.compile(f"[^{_WRITABLE}]")
_HEX_PAIR: Final = re.compile("[0-9A-Fa-f]{2}")
# A local part this does not match is written as it is: the cases _escape_char
# changes, and '%' (kept before two hex digits). Unlike prov's own test, a '-' or '.'
# inside (as in ``batch/demo-0/task/1``) is let through, as it stays the same.
_NOT_PLAIN: Final = re.compile(
    rf"^[-.{_NOT_FIRST}]|\.\Z|[{re.escape(_METACHARACTERS)}%]|[^{_WRITABLE}]"
)

# prov's reading of an xsd:dateTime (``parse_xsd_datetime``).
_HOUR_24: Final = re.compile(r"T24:00:00(\.0+)?(?=$|[Z+-])")
_FRACTION: Final = re.compile(r"\.(\d+)")

_INT32: Final = 2**31
_INT64: Final = 2**63


class Name(NamedTuple):
    """A qualified name (or a formal time) as written: in PROV-N and as a PROV-JSON string."""

    provn: str
    json: str


# A value of an attribute; None leaves the attribute out, as prov does.
Value = str | int | float | Name | None
Attributes = dict[Name, Value]


def _escape_local(local: str) -> str:
    """Return ``local`` as PROV-N writes a local part (prov's ``_provn_escape_local``).

    Metacharacters, a leading ``-`` or ``.`` and a trailing ``.`` take a backslash;
    a character PN_LOCAL cannot hold, or cannot start with, and a ``%`` not followed
    by two hex digits are percent-encoded as UTF-8.
    """
    if not _NOT_PLAIN.search(local):
        return local
    last = len(local) - 1
    return "".join(_escape_char(local, i, last, char) for i, char in enumerate(local))


def _escape_char(local: str, i: int, last: int, char: str) -> str:
    if i == 0 and _BAD_FIRST.match(char):
        return _percent(char)
    if char == "%":
        return char if _HEX_PAIR.match(local, i + 1) else "%25"
    if (i == 0 and char in "-.") or (i == last and char == ".") or char in _METACHARACTERS:
        return f"\\{char}"
    if _UNWRITABLE.match(char):
        return _percent(char)
    return char


def _percent(char: str) -> str:
    # A lone surrogate is encoded from its code unit, as prov does, not refused.
    return "".join(f"%{byte:02X}" for byte in char.encode("utf-8", "surrogatepass"))


def _name(prefix: str, local: str) -> Name:
    return Name(f"{prefix}:{_escape_local(local)}", encode_basestring_ascii(f"{prefix}:{local}"))


def _run(local: str) -> Name:
    """Return ``run:<local>``, a name in the campaign's own namespace."""
    return _name("run", local)


@functools.lru_cache(maxsize=256)
def _term(local: str) -> Name:
    """Return ``u:<local>``, a term of unattended's vocabulary (few: cached)."""
    return _name("u", local)


PROV_TYPE: Final = _name("prov", "type")
PROV_LABEL: Final = _name("prov", "label")
PROV_VALUE: Final = _name("prov", "value")
PROV_ROLE: Final = _name("prov", "role")


def _time(text: str | None) -> Name | None:
    """Return a recorded time as prov writes an ``xsd:dateTime``; None for none (or "").

    prov reads the text (``Z``, hour 24, any number of fraction digits) into a
    datetime and writes its ``isoformat()``, in UTC if the offset is not whole minutes.

    Raises:
        ValueError: ``text`` is not an xsd:dateTime.
    """
    if not text:
        return None
    value = text.strip()
    if "T" not in value:  # a date alone is no xsd:dateTime
        raise ValueError(f"not an xsd:dateTime: {text!r}")
    # prov's rewrites (its regular expressions), each tried only where it can apply:
    # an export's times need none of them.
    end_of_day = "T24:" in value and _HOUR_24.search(value) is not None
    if end_of_day:  # 24:00:00 is the next day's midnight
        value = _HOUR_24.sub("T00:00:00", value)
    if value.endswith("Z"):
        value = value[:-1] + "+00:00"
    fraction = _FRACTION.search(value)
    if fraction is not None and len(fraction[1]) != 6:
        digits = fraction[1][:6].ljust(6, "0")
        value = f"{value[: fraction.start()]}.{digits}{value[fraction.end() :]}"
    try:
        moment = datetime.fromisoformat(value)
        if end_of_day:
            moment += timedelta(days=1)
    except (ValueError, OverflowError) as exc:
        raise ValueError(f"not an xsd:dateTime: {text!r}") from exc
    offset = moment.utcoffset()
    if offset is not None and (offset.total_seconds() % 60 or offset.microseconds):
        moment = moment.astimezone(UTC)
    written = moment.isoformat()
    return Name(written, encode_basestring_ascii(written))


def _string(text: str) -> str:
    """Return ``text`` as a PROV-N string literal: triple-quoted if it holds a line feed."""
    quoted = text.replace("\\", "\\\\").replace('"', '\\"')
    if "\n" in quoted:
        return f'"""{quoted}"""'
    return '"' + quoted.replace("\r", "\\r") + '"'


def _literal(value: str | int | float | Name) -> tuple[str, str]:
    """Return an attribute value as PROV-N and as PROV-JSON write it, typed as prov types it."""
    if isinstance(value, str):
        return _string(value), encode_basestring_ascii(value)
    if isinstance(value, Name):
        return f"'{value.provn}'", f'{{"$": {value.json}, "type": "xsd:QName"}}'
    if isinstance(value, bool):
        text = "true" if value else "false"
        return f'"{text}" %% xsd:boolean', text
    if isinstance(value, int):
        datatype = _integer_type(value)
        typed = f'{{"$": "{value}", "type": "{datatype}"}}'
        # A bare integer is PROV-N's short form of an xsd:int.
        return (str(value) if datatype == "xsd:int" else f'"{value}" %% {datatype}'), typed
    if isinstance(value, float):
        text = _double(value)
        return f'"{text}" %% xsd:double', f'{{"$": "{text}", "type": "xsd:double"}}'
    raise TypeError(f"no PROV literal for {type(value).__name__}")


def _integer_type(value: int) -> str:
    """Return the XSD type prov gives an integer, by its magnitude."""
    if -_INT32 <= value < _INT32:
        return "xsd:int"
    if -_INT64 <= value < _INT64:
        return "xsd:long"
    return "xsd:integer"


def _double(value: float) -> str:
    """Return a float's xsd:double text: NaN, INF or -INF, else its repr()."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "INF" if value > 0 else "-INF"
    return float.__repr__(value)


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
                text, encoded = _literal(given)
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
            text, encoded = _literal(role)
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
            campaign = _run("campaign")
            chunk.activity(
                campaign,
                _time(item.created_at),
                _time(item.updated_at) if ended else None,
                {
                    PROV_TYPE: _term("campaign"),
                    PROV_LABEL: f"campaign {item.name}",
                    _term("status"): item.status,
                    _term("error_code"): item.error_code or "",
                    _term("site"): item.site,
                    _term("seed"): item.seed,
                    _term("code_version"): item.code_version,
                },
            )
            spec = _run("input/spec_recorded")
            chunk.entity(
                spec,
                {
                    PROV_TYPE: _term("spec"),
                    PROV_LABEL: "the campaign spec as recorded (notify URLs masked)",
                    PROV_VALUE: json.dumps(item.spec, sort_keys=True),
                },
            )
            chunk.used(campaign, spec)
            # prov:SoftwareAgent and prov:Person are written as strings, not names, as
            # they always were.
            engine = _run("engine")
            chunk.agent(engine, {PROV_TYPE: "prov:SoftwareAgent", PROV_LABEL: "unattended"})
            chunk.associated_with(campaign, engine)
            for tool, label in (
                ("gate", "accept gate"),
                ("verifier", "verifier"),
                ("simulation", "simulation"),
                ("approval", "approval form"),
            ):
                chunk.agent(_run(tool), {PROV_TYPE: "prov:SoftwareAgent", PROV_LABEL: label})
        case Input():
            entity = _run(f"input/{item.name}")
            chunk.entity(
                entity,
                {
                    PROV_TYPE: _term("pinned_input"),
                    PROV_LABEL: item.file or item.name,
                    _term("sha256"): item.sha256,
                    _term("revision"): item.revision,
                },
            )
            chunk.used(_run("campaign"), entity)
        case Agent():
            kind = "prov:Person" if item.kind == "person" else "prov:SoftwareAgent"
            chunk.agent(_run(item.id), {PROV_TYPE: kind, PROV_LABEL: item.name})
        case Action():
            _action(chunk, item)
        case Job():
            chunk.entity(
                _run(f"job/{item.job_id}"),
                {
                    PROV_TYPE: _term("allocation"),
                    PROV_LABEL: f"Slurm job {item.job_id}",
                    _term("nodes"): " ".join(item.nodes),
                    _term("state"): item.state or "",
                    _term("end_reason"): item.end_reason or "",
                    _term("started_at"): item.started_at or "",
                    _term("ended_at"): item.ended_at or item.ends_at or "",
                },
            )


def _action(chunk: _Chunk, action: Action) -> None:
    """Keep an action's activity, its relations and the values it introduces."""
    activity = _run(action.id)
    attributes: Attributes = {
        PROV_TYPE: _term(action.kind),
        PROV_LABEL: action.name,
        _term("status"): action.status,
    }
    for key, text in (
        ("error", action.error),
        ("description", action.description),
        ("host", action.host),
        ("slurm_job", action.job),
    ):
        if text:
            attributes[_term(key)] = text
    for key, number in action.properties.items():
        if isinstance(number, str | int | float) and not isinstance(number, bool):
            attributes[_term(key)] = number
    chunk.activity(activity, _time(action.start), _time(action.end), attributes)
    chunk.started_by(activity, _run(action.parent or "campaign"))
    if action.agent:
        chunk.associated_with(activity, _run(action.agent))
    for person in action.participants:
        chunk.associated_with(activity, _run(person), role=_term("allowed_approver"))
    for value in action.values:
        chunk.entity(
            _run(value.id),
            {PROV_TYPE: _term("value"), PROV_LABEL: value.name, PROV_VALUE: value.text()},
        )
    for used in action.used:
        chunk.used(activity, _run(used))
    for generated in action.generated:
        chunk.generated_by(_run(generated), activity)
    if action.job:
        chunk.used(activity, _run(f"job/{action.job}"))


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
