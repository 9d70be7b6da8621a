"""``export --format prov`` writes PROV-N and PROV-JSON as the ``prov`` library itself does.

The writer (``flows/_provenance/_prov.py``) writes the records as text. The reference
here builds the same records with ``prov.model.ProvDocument``, one document per
``CHUNK`` items, and serialises them with ``prov``: PROV-N from the document's
``get_provn()``, PROV-JSON from ``encode_json_container`` with anonymous ids
renumbered across the documents (what the export did before it wrote the text
itself). Both files must be the same, byte for byte: on hand-made items with awkward
names, texts, numbers and times, on generated actions, and on a recorded campaign.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Iterable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prov.model import Namespace, ProvDocument
from prov.serializers.provjson import encode_json_container

from flows._provenance import ProvenanceStore
from flows._provenance._prov import CHUNK, write_prov
from flows._provenance._run_graph import (
    Action,
    Agent,
    Campaign,
    Input,
    Item,
    Job,
    Value,
    campaign_graph,
)

TERMS = Namespace("u", "urn:unattended:terms#")
ANONYMOUS = re.compile(r"^_:id\d+$")


# The reference: the records built and serialised by prov (the export's former code).
def _when(text: str | None) -> str | None:
    return text or None


def _reference_records(document: ProvDocument, run: Namespace, item: Item) -> None:
    """Add ``item``'s records to ``document`` with prov's API (see the module doc)."""
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
            _reference_action(document, run, item)
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


def _reference_action(document: ProvDocument, run: Namespace, action: Action) -> None:
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


def _chunks(items: list[Item]) -> Iterable[list[Item]]:
    """Yield ``items`` a chunk (one prov document) at a time."""
    for start in range(0, len(items), CHUNK):
        yield items[start : start + CHUNK]


def reference(items: list[Item]) -> tuple[str, str, dict[str, int]]:
    """Return ``items`` as prov writes them: PROV-N, PROV-JSON and records per type.

    The first item is the campaign. prov warns about names PROV-N cannot write as
    they are (it percent-encodes them): not the point here.
    """
    campaign = items[0]
    assert isinstance(campaign, Campaign)
    uri = f"urn:unattended:campaign:{quote(campaign.name, safe='')}:"
    prefixes = {"u": TERMS.uri, "run": uri}
    header = "".join(f"  prefix {prefix} <{iri}>\n" for prefix, iri in prefixes.items())
    provn = ["document\n", header, "\n"]
    members: dict[str, list[str]] = {}
    anonymous = 0
    for chunk in _chunks(items):
        run = Namespace("run", uri)
        document = ProvDocument()
        document.add_namespace(TERMS)
        document.add_namespace(run)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for item in chunk:
                _reference_records(document, run, item)
            text = document.get_provn()
            container = encode_json_container(document)
        # prov's own document, less its header and its last line.
        own_header = "document\n" + header + "  \n"
        assert text.startswith(own_header)
        assert text.endswith("\nendDocument")
        provn.append(text[len(own_header) : -len("endDocument")])
        for kind, records in container.items():
            if kind == "prefix":
                continue
            for identifier, body in records.items():
                if ANONYMOUS.match(identifier):
                    anonymous += 1
                    identifier = f"_:id{anonymous}"
                members.setdefault(kind, []).append(
                    f"    {json.dumps(identifier)}: {json.dumps(body)}"
                )
    provn.append("endDocument\n")
    provjson = '{\n  "prefix": ' + json.dumps(prefixes)
    for kind, entries in members.items():
        provjson += f",\n  {json.dumps(kind)}: {{\n" + ",\n".join(entries) + "\n  }"
    return "".join(provn), provjson + "\n}\n", {k: len(v) for k, v in members.items()}


def _assert_written_as_prov_writes(items: list[Item], folder: Path) -> None:
    provn, provjson, counts = reference(items)
    written = write_prov(items, folder / "p.provn", folder / "p.prov.json")
    # Bytes: a text read would turn a carriage return in a PROV-N string into a line feed.
    assert (folder / "p.provn").read_bytes() == provn.encode()
    assert (folder / "p.prov.json").read_bytes() == provjson.encode()
    assert written == counts


def _document(items: list[Item]) -> ProvDocument:
    """Return one prov document of all ``items``' records."""
    campaign = items[0]
    assert isinstance(campaign, Campaign)
    run = Namespace("run", f"urn:unattended:campaign:{quote(campaign.name, safe='')}:")
    document = ProvDocument()
    document.add_namespace(TERMS)
    document.add_namespace(run)
    for item in items:
        _reference_records(document, run, item)
    return document


# Hand-made items: awkward names, texts, numbers and times.
AWKWARD = [
    "plain",
    "with space",
    "quote\"d and 'single'",
    "back\\slash",
    "colon:semi;equals=paren()brackets[]comma,",
    "slash/hash#percent%zz",
    "escaped%41hex",
    "-leading dash",
    ".leading dot",
    "trailing dot.",
    "\u00b7middle dot first",
    "combining \u0301 accent",
    "unicode é 名前 😀",
    "",
    "new\nline",
    "blank\n\nline",
    "carriage\rreturn",
    "both\r\n",
    "line\u2028separator\x85next\x0cform",
    "tab\tand <angle> {brace} |pipe| ^caret^ `tick`",
]
NUMBERS = [
    0,
    -1,
    2**31 - 1,
    2**31,
    -(2**31),
    -(2**31) - 1,
    2**63 - 1,
    2**63,
    -(2**63) - 1,
    10**30,
    0.1,
    -0.0,
    1e300,
    5e-324,
    float("nan"),
    float("inf"),
    float("-inf"),
    True,  # a flag: properties leave it out
]
TIMES = [
    None,
    "",
    "2026-12-03T19:54:09.915133+00:00",
    "2026-12-03T19:54:09Z",
    "2026-12-03T19:54:09.5Z",
    "2026-12-03T19:54:09.123456789-05:30",
    "2026-12-03T19:54:09.000000+00:00",
    "2026-12-03T19:54:09-00:00",
    "2026-12-31T24:00:00+01:00",
    "2026-12-03T19:54:09",
    " 2026-12-03T19:54:09+14:30 ",
    "2026-12-03T19:54:09+05:30:15",
]


def awkward_items() -> list[Item]:
    """A campaign with every kind of item, awkward values, over three chunks."""
    items: list[Item] = [
        Campaign(
            name='demo run/α %20 "q"',
            spec={"name": "demo", "notify": {"urls": ["<secret>"]}, "ü": [1, 2.5, None]},
            site="local",
            seed=2**40,
            code_version="t\\1",
            status="failed",
            error_code=None,
            created_at="2026-12-03T19:54:09.9Z",
            updated_at="2026-12-03T20:00:00+02:00",
        ),
        Input("spec", "campaign.toml", "ab" * 32, 1),
        Input("site config", None, "cd" * 32, 2**31),
        Input("flag", "f", "00", True),  # "true" %% xsd:boolean
    ]
    items += [Input(name, name or None, "ef", index) for index, name in enumerate(AWKWARD)]
    items += [Agent(f"person/{name}", "person", name) for name in AWKWARD]
    items += [Agent("planner", "software", "planner (scripted)")]
    for index, text in enumerate(AWKWARD):
        own = f"round/{index}/{text}"
        proposal = Value(f"{own}/proposal", text, {"x": [index, 0.5], "why": text})
        answer = Value(f"{own}/answer", "answer", text)
        items.append(
            Action(
                id=own,
                kind="approval" if index % 2 else "attempt",
                name=text,
                status="completed",
                start=TIMES[index % len(TIMES)],
                end=TIMES[(index + 3) % len(TIMES)],
                parent=f"round/{index}" if index % 3 else None,
                agent=f"person/{text}" if index % 4 else None,
                participants=(f"person/{AWKWARD[index - 1]}", "person/plain"),
                values=(proposal, answer),
                used=(proposal.id, "input/spec"),
                generated=(answer.id,),
                error=text or None,
                description=text,
                host=text,
                job=text,
                properties={
                    "duration": NUMBERS[index % len(NUMBERS)],
                    "identifier": text,
                    f"key {text}": NUMBERS[(index + 5) % len(NUMBERS)],
                    "absent": None,
                    "listed": [1, 2],
                },
            )
        )
        items.append(
            Job(
                job_id=text,
                request=index,
                state=None if index % 2 else "COMPLETED",
                nodes=(text, "node2"),
                requested_at=None,
                started_at=TIMES[index % len(TIMES)],
                ends_at="2026-12-04T00:00:00+00:00",
                ended_at=None,
                end_reason=None,
            )
        )
    # The same records twice in one chunk: prov writes them once, as a list, and
    # gives equal anonymous relations one id.
    twice = Action(
        id="twice",
        kind="attempt",
        name="twice",
        status="failed",
        agent="planner",
        participants=("planner", "planner"),
        used=("input/spec", "input/spec"),
        generated=("twice/value", "twice/value"),
        values=(Value("twice/value", "v", 1), Value("twice/value", "v", 2)),
    )
    items += [twice, twice]
    # Filler to cross two chunk boundaries: anonymous ids numbered across chunks.
    items += [
        Action(
            id=f"batch/b-{n}/task/{n}",
            kind="simulation_task",
            name=f"simulation task {n}",
            status="active",
            start="2026-12-03T19:54:09.915133+00:00",
            parent="round/1",
            agent="simulation",
            used=("input/spec",),
            properties={"duration": n / 7, "identifier": f"b-{n}"},
        )
        for n in range(2 * CHUNK)
    ]
    items.append(twice)
    return items


class TestSameAsProv:
    def test_awkward_items_are_written_byte_for_byte_as_prov_writes_them(
        self, tmp_path: Path
    ) -> None:
        items = awkward_items()
        assert len(items) > 2 * CHUNK
        _assert_written_as_prov_writes(items, tmp_path)

    def test_a_recorded_campaign_is_written_as_prov_writes_it_and_reads_back(
        self, tmp_path: Path, record_campaign: Any
    ) -> None:
        with ProvenanceStore.open(tmp_path / "campaign") as store:
            record_campaign(store, "demo", rounds=2)
            store.pin_inputs(
                "demo", 1, {"spec": ("campaign.toml", "ab" * 32), "site": (None, "cd")}
            )
            store.record_allocations(
                "demo",
                [
                    {
                        "job_id": "4242",
                        "request": 1,
                        "state": "COMPLETED",
                        "nodes": ["n1", "n2"],
                        "node_count": 2,
                        "requested_at": 1_799_999_990.0,
                        "started_at": 1_800_000_000.0,
                        "ended_at": 1_800_000_060.0,
                    }
                ],
            )
            with store.reading() as reader:
                items = list(campaign_graph(reader, "demo"))
        assert {type(item) for item in items} == {Campaign, Input, Agent, Action, Job}
        _assert_written_as_prov_writes(items, tmp_path)
        records = _document(items)
        for path, form in ((tmp_path / "p.prov.json", "json"), (tmp_path / "p.provn", "provn")):
            assert ProvDocument.deserialize(str(path), format=form) == records, form

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        ids=st.lists(st.text(max_size=8), min_size=4, max_size=4),
        texts=st.lists(st.text(max_size=12), min_size=3, max_size=3),
        number=st.one_of(
            st.integers(min_value=-(2**70), max_value=2**70), st.floats(), st.text(max_size=5)
        ),
        # A day from either end: a time's offset moves it by up to 23 hours.
        moment=st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
        offset=st.none()
        | st.just(timedelta(0))  # UTC
        | st.timedeltas(min_value=timedelta(hours=-23), max_value=timedelta(hours=23)),
    )
    def test_any_action_is_written_as_prov_writes_it(
        self,
        tmp_path_factory: pytest.TempPathFactory,
        ids: list[str],
        texts: list[str],
        number: Any,
        moment: datetime,
        offset: timedelta | None,
    ) -> None:
        if offset is not None:  # whole minutes or not (then prov writes the time in UTC)
            moment = moment.replace(tzinfo=timezone(offset))
        campaign = Campaign(texts[0], {}, texts[1], 1, texts[2], "running", None, "", "")
        action = Action(
            id=ids[0],
            kind=ids[1] or "attempt",
            name=texts[0],
            status=texts[1],
            start=moment.isoformat(),
            end=moment.isoformat(timespec="milliseconds"),
            parent=ids[2],
            agent=ids[3],
            participants=(ids[3],),
            values=(Value(ids[2], texts[2], texts[0]),),
            used=(ids[2],),
            generated=(ids[1],),
            description=texts[2],
            properties={ids[3] or "key": number},
        )
        _assert_written_as_prov_writes([campaign, action], tmp_path_factory.mktemp("any"))


def test_a_time_that_is_no_xsd_datetime_is_refused(tmp_path: Path) -> None:
    """prov refuses it (ProvException); so does the writer (ValueError)."""
    campaign = Campaign("c", {}, "local", 1, "t", "failed", None, "2026-12-03", "")
    with pytest.raises(ValueError, match="xsd:dateTime"):
        write_prov([campaign], tmp_path / "p.provn", tmp_path / "p.prov.json")
