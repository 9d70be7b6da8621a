"""Pinned inputs: the content hash of everything a campaign's spec names.

At first submission the hashes of the spec file, the policy file, the transcript,
the site config and the simulation (its argv, and every argv element that is a
file) are recorded as input revision 1. Every later submission and every flow run
compares the current hashes against the latest revision: a difference is refused
with ``spec_changed`` naming the input and its file, unless the user accepts the
change, which records a new revision and an ``inputs_revised`` event (who, when,
old and new hashes). So a copied spec with a weakened policy, or a policy edited
in place, never silently drives a campaign that was decided under another one.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flows._engine._extension import (
    FieldChange,
    describe_extension,
    extension_details,
    is_extension,
    refused,
    spec_changes,
)
from flows._engine._simulation import simulation_argv
from flows._masking import notify_secrets_masked
from flows._provenance import ProvenanceStore, SpecChanged
from flows._provenance._rows import jsonable
from flows._spec import LoadedSpec, ScriptedPlannerSpec
from policies import SpecInvalid
from tasks import SiteConfig

Pins = dict[str, tuple[str | None, str]]


def _file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def current_inputs(loaded: LoadedSpec, site: SiteConfig) -> Pins:
    """Return ``{input: (file, sha256)}`` for what the spec names, as it is on disk now."""
    spec = loaded.spec
    pins: Pins = {"spec": (str(loaded.path), _file_hash(loaded.path))}
    if spec.policy is not None:
        policy = loaded.resolve(spec.policy)
        pins["policy"] = (str(policy), _file_hash(policy))
    if isinstance(spec.planner, ScriptedPlannerSpec):
        transcript = loaded.resolve(spec.planner.transcript)
        pins["transcript"] = (str(transcript), _file_hash(transcript))
    if site.source is not None:
        pins["site"] = (site.source, _file_hash(Path(site.source)))
    argv = simulation_argv(loaded)
    named = "demo" if spec.objective.simulation == "demo" else argv
    digest = hashlib.sha256(json.dumps(named).encode())
    program = _program(argv)
    if program is not None:
        digest.update(_file_hash(program).encode())
    pins["simulation"] = (str(program) if program else None, digest.hexdigest())
    return pins


def _program(argv: list[str]) -> Path | None:
    """Return the file the simulation runs: the script after an interpreter, else the binary.

    Later arguments are left out: they may name the simulation's own output files.
    """
    if len(argv) > 1 and Path(argv[1]).is_file():
        return Path(argv[1])
    if argv and Path(argv[0]).is_file() and argv[0] != sys.executable:
        return Path(argv[0])
    return None


def changed_inputs(pinned: Pins, current: Pins) -> list[str]:
    """Return the inputs whose hash differs (or that appeared or vanished), sorted."""
    return sorted(
        name
        for name in set(pinned) | set(current)
        if pinned.get(name, (None, ""))[1] != current.get(name, (None, ""))[1]
    )


def check_inputs(
    store: ProvenanceStore,
    loaded: LoadedSpec,
    site: SiteConfig,
    *,
    accept_changes: bool = False,
    flow_run_id: str | None = None,
    extension: Sequence[FieldChange] = (),
) -> int:
    """Pin the inputs at first use; refuse (or, accepted, record) a change; return the revision.

    ``extension`` is the spec's fields an extension raised (``flows._engine._extension``):
    the spec file's new hash is then expected, and the new revision also replaces the
    recorded spec and records a ``campaign_extended`` event (who, when, old and new).

    Raises:
        SpecChanged: an input differs from the latest pinned revision and
            ``accept_changes`` is False. The campaign's record is left untouched
            but for a ``spec_changed`` event.
    """
    name = loaded.spec.name
    current = current_inputs(loaded, site)
    revision, pinned = store.pinned_inputs(name)
    spec = loaded.raw if extension else None
    if not pinned:
        store.pin_inputs(name, 1, current, spec=spec)
        store.record_event(name, "inputs_pinned", flow_run_id=flow_run_id, details={"revision": 1})
        _record_extension(store, name, 1, extension, flow_run_id)
        return 1
    changed = [c for c in changed_inputs(pinned, current) if not (extension and c == "spec")]
    if not changed and not extension:
        return revision
    hashes = {
        key: {"old": pinned.get(key, (None, None))[1], "new": current.get(key, (None, None))[1]}
        for key in changed
    }
    if accept_changes or not changed:
        store.pin_inputs(name, revision + 1, current, spec=loaded.raw)
        if changed:
            store.record_event(
                name,
                "inputs_revised",
                flow_run_id=flow_run_id,
                actor=_os_user(),
                details={"revision": revision + 1, "changed": hashes},
            )
        _record_extension(store, name, revision + 1, extension, flow_run_id)
        return revision + 1
    first = changed[0]
    file = current.get(first, pinned.get(first, (None, "")))[0]
    details: dict[str, Any] = {"input": first, "file": file, "changed": changed}
    store.record_event(
        name, "spec_changed", flow_run_id=flow_run_id, details={**details, "hashes": hashes}
    )
    raise SpecChanged(
        f"campaign {name!r}: {first} {file or ''} changed since the campaign was pinned "
        f"(revision {revision}; changed: {', '.join(changed)}); "
        "resubmit with --accept-changes to record a new input revision",
        details=details,
    )


def _record_extension(
    store: ProvenanceStore,
    name: str,
    revision: int,
    extension: Sequence[FieldChange],
    flow_run_id: str | None,
) -> None:
    if extension:
        store.record_event(
            name,
            "campaign_extended",
            flow_run_id=flow_run_id,
            actor=_os_user(),
            details={"revision": revision, "fields": extension_details(extension)},
        )


def open_campaign(
    store: ProvenanceStore,
    loaded: LoadedSpec,
    site: SiteConfig,
    *,
    code_version: str,
    accept_changes: bool = False,
    flow_run_id: str | None = None,
    extend: bool = False,
) -> int:
    """Create (or find) the campaign's record and check its pinned inputs; return the revision.

    A spec whose fields differ from the recorded ones is refused naming each field
    (``flows._engine._extension``), whatever ``accept_changes`` says: it is another
    campaign. With ``extend`` (a submission, not a flow run) a spec that only raises
    ``rounds`` or ``budget_node_hours`` is recorded as a new revision instead.
    """
    name = loaded.spec.name

    def ensure() -> None:
        store.ensure_campaign(
            name, spec=loaded.raw, site=site.name, seed=loaded.spec.seed, code_version=code_version
        )

    try:
        ensure()
    except SpecInvalid as exc:
        if exc.details.get("campaign") != name:
            raise
        changes = recorded_changes(store, loaded)
        if not changes:
            raise
        if not (extend and is_extension(changes)):
            raise _refusal(loaded, changes) from None
        revision = check_inputs(
            store,
            loaded,
            site,
            accept_changes=accept_changes,
            flow_run_id=flow_run_id,
            extension=changes,
        )
        ensure()
        return revision
    return check_inputs(store, loaded, site, accept_changes=accept_changes, flow_run_id=flow_run_id)


def recorded_changes(store: ProvenanceStore, loaded: LoadedSpec) -> list[FieldChange]:
    """Return how ``loaded`` differs from the spec recorded under its name ([]: none recorded)."""
    name = loaded.spec.name
    if not any(row["name"] == name for row in store.campaigns()):
        return []
    recorded = store.summary(name)["campaign"]
    return changes_from_record(recorded, loaded)


def changes_from_record(recorded: Mapping[str, Any], loaded: LoadedSpec) -> list[FieldChange]:
    """Return how ``loaded`` differs from a campaign row (its ``spec`` and ``seed``)."""
    old = recorded.get("spec")
    # A record made before [notify] URLs were masked holds them in clear: mask it alike.
    old = jsonable(notify_secrets_masked(old)) if isinstance(old, dict) else {}
    return spec_changes(old, recorded.get("seed"), jsonable(loaded.raw), loaded.spec.seed)


def _refusal(loaded: LoadedSpec, changes: Sequence[FieldChange]) -> SpecChanged:
    if is_extension(changes):  # a flow run never extends: the submission records it
        return SpecChanged(
            f"{loaded.path}: campaign {loaded.spec.name!r} was extended in the file "
            f"({describe_extension(changes)}) but not submitted; 'unattended submit "
            f"{loaded.path}' records the extension",
            details={
                "campaign": loaded.spec.name,
                "input": "spec",
                "file": str(loaded.path),
                "field": changes[0].field,
                "fields": [c.field for c in changes],
            },
        )
    return refused(loaded.spec.name, changes, str(loaded.path))


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"
