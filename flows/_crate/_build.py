"""Write a campaign as a Provenance Run Crate (``unattended export --format ro-crate``).

The crate follows the Workflow Run RO-Crate profiles (Process, Workflow and
Provenance Run Crate 0.5, on RO-Crate 1.1 and Workflow RO-Crate 1.0) and is built
from the provenance database alone (``docs/ro-crate.md`` has the whole mapping):

* ``spec.json``, the campaign spec as recorded (notify URLs masked), is the
  workflow (``mainEntity``) the campaign flow ran; its tools (planner, gate,
  verifier, policy, approval, simulation, the round loop) are its parts and its
  steps; the pinned inputs (spec, policy, transcript, site, simulation) are its
  inputs, each with its ``sha256`` (their content is not in the database, so not in
  the crate: the site config's secrets never are);
* the campaign run is a ``CreateAction``; each round, gate call, attempt, verifier
  run and task, and simulation task is a ``CreateAction`` of its tool, each policy
  decision, approval and approver's answer an ``AssessAction``, and every one of
  them has its ``ControlAction`` (the step) listed by the engine's ``OrganizeAction``;
* approvers are ``Person`` entities, the planner and the policy are the agents of
  their actions; proposals, candidates, results and outcomes are ``PropertyValue``;
* ``report/report.html`` (the offline report), ``records.jsonl`` (``export
  --format jsonl``) and the W3C PROV files (``provenance.prov.json``,
  ``provenance.provn``) are in the crate.

``rocrate`` builds every entity. It keeps a crate's entities in memory and writes
the metadata as one ``json.dumps``, so the fixed part (root, workflow, tools,
inputs, files: a few dozen entities) is a :class:`rocrate.rocrate.ROCrate`, and the
actions (millions for a big campaign) are ``rocrate`` entities made one at a time
and appended to ``ro-crate-metadata.json`` as they come
(:mod:`flows._crate._actions`): memory stays flat in the number of
attempts. The crate appears whole or not at all (written beside the target, then
renamed; a ``.zip`` is written from the finished folder).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Final

from rocrate.model import ComputerLanguage, ContextEntity
from rocrate.rocrate import ROCrate

from flows._crate._actions import STATUS, ActionWriter, agent_id, ref, refs
from flows._paths import private_dir
from flows._provenance import _export
from flows._provenance._prov import ProvWriter
from flows._provenance._run_graph import (
    KINDS,
    TOOL_OF,
    Action,
    Agent,
    Campaign,
    Input,
    Job,
    campaign_graph,
    masked_spec,
)

PROFILES: Final = {
    "https://w3id.org/ro/wfrun/process/0.5": ("Process Run Crate", "0.5"),
    "https://w3id.org/ro/wfrun/workflow/0.5": ("Workflow Run Crate", "0.5"),
    "https://w3id.org/ro/wfrun/provenance/0.5": ("Provenance Run Crate", "0.5"),
    "https://w3id.org/workflowhub/workflow-ro-crate/1.0": ("Workflow RO-Crate", "1.0"),
}
METADATA: Final = "ro-crate-metadata.json"
SPEC: Final = "spec.json"
RECORDS: Final = "records.jsonl"
REPORT_DIR: Final = "report"
PROV_JSON: Final = "provenance.prov.json"
PROVN: Final = "provenance.provn"

_TOOLS: Final = {
    "engine": ("round loop", "The campaign flow's round loop: one round of proposals and tasks."),
    "gate": ("accept gate", "Asks the planner for a proposal and checks it, with a fallback."),
    "planner": ("planner", "Proposes the next batch of candidates."),
    "verifier": ("verifier", "Runs the verifier tasks on a proposal before it is accepted."),
    "policy": ("policy", "Decides whether a round's batch may run (rules, severities)."),
    "approval": ("approval", "Asks the allowed approvers and records their answers."),
    "simulation": ("simulation", "The simulation each candidate of a batch runs."),
}
_STEP_NAMES: Final = {
    "round": "run a round",
    "gate_call": "call the accept gate",
    "attempt": "ask the planner (one attempt)",
    "verifier_run": "verify a proposal",
    "verifier_task": "run a verifier task",
    "decision": "decide by policy",
    "approval": "ask for approval",
    "approval_event": "answer an approval",
    "simulation_task": "run a simulation task",
}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _fixed_crate(campaign: Campaign, folder: Path) -> ROCrate:
    """Return the crate's fixed part: root, profiles, workflow, engine and output files."""
    crate = ROCrate(gen_preview=False, version="1.1")
    crate.name = f"Campaign {campaign.name}"
    crate.description = (
        f"Provenance of the unattended campaign {campaign.name!r} (site {campaign.site}, "
        f"seed {campaign.seed}, status {campaign.status}), exported from its provenance database."
    )
    crate.datePublished = campaign.updated_at
    crate.root_dataset["license"] = "https://spdx.org/licenses/CC-BY-4.0"
    for profile, (name, version) in PROFILES.items():
        crate.add(
            ContextEntity(
                crate,
                profile,
                properties={"@type": "CreativeWork", "name": name, "version": version},
            )
        )
    crate.root_dataset["conformsTo"] = [ref(p) for p in PROFILES]
    language = crate.add(
        ComputerLanguage(
            crate,
            "#unattended-campaign-spec",
            properties={
                "name": "unattended campaign spec",
                "alternateName": "unattended",
                "version": campaign.code_version,
            },
        )
    )
    crate.add_workflow(
        folder / SPEC,
        SPEC,
        main=True,
        lang=language,
        properties={
            "@type": ["File", "SoftwareSourceCode", "ComputationalWorkflow", "HowTo"],
            "name": f"campaign flow {campaign.name}",
            "description": "The campaign spec as recorded, which the campaign flow runs "
            "(notify URLs masked).",
            "encodingFormat": "application/json",
            "version": campaign.code_version,
            "sha256": _sha256(folder / SPEC),
        },
    )
    crate.add(
        ContextEntity(
            crate,
            "#unattended",
            properties={
                "@type": "SoftwareApplication",
                "name": "unattended",
                "version": campaign.code_version,
                "description": "Durable workflow orchestrator (Prefect flow, asyncflow backends).",
            },
        )
    )
    return crate


def _add_files(crate: ROCrate, folder: Path) -> list[str]:
    """Add the crate's output files (report, records, PROV); return their ids."""
    described = {
        RECORDS: ("Every record of the campaign (export --format jsonl)", "application/x-ndjson"),
        PROV_JSON: ("The campaign's graph as W3C PROV-JSON", "application/json"),
        PROVN: ("The campaign's graph as W3C PROV-N", "text/provenance-notation"),
    }
    report = folder / REPORT_DIR
    for path in sorted(report.iterdir()) if report.is_dir() else ():
        kind = "text/html" if path.suffix == ".html" else "image/png"
        described[f"{REPORT_DIR}/{path.name}"] = (f"Offline report: {path.name}", kind)
    ids = []
    for name, (title, media) in described.items():
        path = folder / name
        crate.add_file(
            path,
            name,
            properties={
                "name": title,
                "encodingFormat": media,
                "contentSize": str(path.stat().st_size),
                "sha256": _sha256(path),
            },
        )
        ids.append(name)
    return ids


def _inputs(crate: ROCrate, inputs: list[Input]) -> list[dict[str, str]]:
    """Add the pinned inputs and their formal parameters; return the parameter refs."""
    parameters = []
    for pin in inputs:
        parameter = f"#param/{pin.name}"
        entity = f"#input/{pin.name}"
        crate.add(
            ContextEntity(
                crate,
                entity,
                properties={
                    "@type": "PropertyValue",
                    "name": pin.name,
                    "value": f"sha256:{pin.sha256}",
                    "description": f"{pin.file or pin.name}, as pinned (input revision "
                    f"{pin.revision}); the file itself is not in the crate",
                },
            )
        )
        crate.add(
            ContextEntity(
                crate,
                parameter,
                properties={
                    "@type": "FormalParameter",
                    "name": pin.name,
                    "additionalType": "File",
                    "valueRequired": pin.name == "spec",
                    "workExample": ref(entity),
                    "conformsTo": ref(
                        "https://bioschemas.org/profiles/FormalParameter/1.0-RELEASE"
                    ),
                },
            )
        )
        parameters.append(ref(parameter))
    return parameters


def _finish_crate(
    crate: ROCrate,
    campaign: Campaign,
    inputs: list[Input],
    agents: list[Agent],
    actions: ActionWriter,
    files: list[str],
) -> None:
    """Add the workflow's tools, steps and inputs, the agents and the campaign run."""
    workflow = crate.mainEntity
    tools = [name for name in _TOOLS if name in actions.tools]
    for name in tools:
        title, text = _TOOLS[name]
        crate.add(
            ContextEntity(
                crate,
                f"#tool/{name}",
                properties={"@type": "SoftwareApplication", "name": title, "description": text},
            )
        )
    steps = [kind for kind in KINDS if kind in actions.kinds]
    for position, kind in enumerate(steps):
        crate.add(
            ContextEntity(
                crate,
                f"#step/{kind}",
                properties={
                    "@type": "HowToStep",
                    "name": _STEP_NAMES[kind],
                    "position": str(position),
                    "workExample": ref(f"#tool/{TOOL_OF[kind]}"),
                },
            )
        )
    for agent in agents:
        if agent.kind == "person":
            crate.add(
                ContextEntity(
                    crate, agent_id(agent.id), properties={"@type": "Person", "name": agent.name}
                )
            )
    workflow["hasPart"] = [ref(f"#tool/{name}") for name in tools]
    workflow["step"] = [ref(f"#step/{kind}") for kind in steps]
    workflow["input"] = _inputs(crate, inputs)
    for agent in agents:  # the planner's and policy's names as the spec states them
        if agent.kind == "software" and agent.id in tools:
            crate.get(f"#tool/{agent.id}")["alternateName"] = agent.name
    ended = campaign.status not in ("running", "awaiting_approval")
    run: dict[str, Any] = {
        "@type": "CreateAction",
        "name": f"Run of campaign {campaign.name}",
        "description": f"status {campaign.status}"
        + (f" ({campaign.error_code})" if campaign.error_code else ""),
        "instrument": ref(SPEC),
        "startTime": campaign.created_at,
        "object": refs([f"#input/{pin.name}" for pin in inputs]),
        "result": refs(files),
        "actionStatus": ref(
            STATUS[
                "completed" if campaign.status == "completed" else "failed" if ended else "active"
            ]
        ),
    }
    if ended:
        run["endTime"] = campaign.updated_at
    if campaign.error_code:
        run["error"] = campaign.error_code
    crate.add(ContextEntity(crate, "#run", properties=run))
    crate.root_dataset["mentions"] = ref("#run")


def _write_metadata(
    crate: ROCrate, campaign: Campaign, folder: Path, graph: IO[str], controls: IO[str]
) -> None:
    """Write ``ro-crate-metadata.json``: the fixed entities, the actions, the OrganizeAction."""
    context = crate.metadata.generate()["@context"]
    organize = ContextEntity(
        crate,
        "#engine-run",
        properties={
            "@type": "OrganizeAction",
            "name": f"unattended orchestrating campaign {campaign.name}",
            "instrument": ref("#unattended"),
            "result": ref("#run"),
            "startTime": campaign.created_at,
        },
    ).properties()
    with (folder / METADATA).open("w", encoding="utf-8") as out:
        out.write('{"@context": ' + json.dumps(context) + ',\n"@graph": [\n')
        out.write(
            ",\n".join(json.dumps(e.properties(), ensure_ascii=False) for e in crate.get_entities())
        )
        graph.seek(0)
        while chunk := graph.read(1 << 20):
            out.write(chunk)
        # The OrganizeAction lists every ControlAction: its 'object' is streamed from
        # the spill file rather than held as a list.
        head = json.dumps(organize, ensure_ascii=False)
        out.write(",\n" + head[:-1] + ', "object": [')
        controls.seek(0)
        first = True
        for line in controls:
            out.write(("" if first else ", ") + json.dumps(ref(line.rstrip("\n"))))
            first = False
        out.write("]}\n]}\n")


def _records(reader: Any, name: str) -> Iterator[dict[str, Any]]:
    for record in _export.export_records(reader, name):
        if record.get("kind") == "campaign":
            record = {**record, "spec": masked_spec(record.get("spec"))}
        yield record


def build_crate(store: Any, name: str, folder: Path) -> dict[str, int]:
    """Write campaign ``name``'s crate into the empty folder ``folder``; return counts.

    ``store`` is a read-only :class:`~flows._provenance.ProvenanceStore` (the report
    needs it). Raises NotFound (before anything is written) for an unknown campaign.
    """
    from flows._report import write_report

    with store.reading() as reader:
        items = campaign_graph(reader, name)
        campaign = next(items)  # NotFound here, before any file
        assert isinstance(campaign, Campaign)
        (folder / SPEC).write_text(json.dumps(campaign.spec, indent=2, sort_keys=True) + "\n")
        with (folder / RECORDS).open("w", encoding="utf-8") as out:
            for record in _records(reader, name):
                out.write(json.dumps(record, separators=(",", ":"), default=str) + "\n")
        crate = _fixed_crate(campaign, folder)
        inputs: list[Input] = []
        agents: list[Agent] = []
        with (
            tempfile.TemporaryFile("w+", encoding="utf-8") as graph,
            tempfile.TemporaryFile("w+", encoding="utf-8") as controls,
            tempfile.TemporaryDirectory(prefix=".prov-", dir=folder) as spill,
            (folder / PROVN).open("w", encoding="utf-8") as provn,
        ):
            actions = ActionWriter(crate, graph, controls)
            prov = ProvWriter(provn, folder / PROV_JSON, Path(spill))
            prov.add(campaign)
            for item in items:
                prov.add(item)
                match item:
                    case Input():
                        inputs.append(item)
                    case Agent():
                        agents.append(item)
                    case Action():
                        actions.action(item)
                    case Job():
                        actions.job(item)
            prov.finish()
            provn.close()
            write_report(store, name, folder / REPORT_DIR)
            files = _add_files(crate, folder)
            _finish_crate(crate, campaign, inputs, agents, actions, files)
            _write_metadata(crate, campaign, folder, graph, controls)
    return {"entities": actions.count + len(crate.get_entities()) + 1, **prov.counts}


def write_crate(store: Any, name: str, target: Path) -> Path:
    """Write the crate to folder ``target`` or, for a ``.zip`` path, a zip file; return it.

    The crate is built in a private folder beside the target and renamed into place
    (a zip is written to a temporary file and renamed), so it appears whole or not at
    all. An existing folder is replaced only if it holds a crate (its metadata file).

    Raises:
        FileExistsError: ``target`` is a folder that is not empty and holds no crate.
    """
    zipped = target.suffix.lower() == ".zip"
    crate_there = (target / METADATA).is_file()
    if not zipped and target.is_dir() and any(target.iterdir()) and not crate_there:
        raise FileExistsError(f"--out {target}: a folder that is not empty and holds no crate")
    parent = target.parent
    parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=parent))
    try:
        os.chmod(work, 0o700)  # candidate values and approvers' names: the owner's
        crate_dir = private_dir(work / "crate")
        build_crate(store, name, crate_dir)
        if zipped:
            temporary = work / "crate.zip"
            with zipfile.ZipFile(temporary, "w", compression=zipfile.ZIP_DEFLATED) as archive:
                for path in sorted(crate_dir.rglob("*")):
                    if path.is_file():
                        archive.write(path, path.relative_to(crate_dir).as_posix())
            os.replace(temporary, target)
        else:
            if target.exists():
                old = work / "old"
                os.replace(target, old)
            os.replace(crate_dir, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target
