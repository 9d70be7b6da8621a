"""A run carries no authority: what executes is what the owner submitted, whoever made the run.

The attacker here holds the server secret (as every co-approver does) and talks to
the real Prefect server's REST API, as another user on the login node would. The
owner's campaign (the approval demo) waits for round 2's approval; the attacker
creates runs of the owner's deployment with another spec (whose simulation would
leave a marker file), another state directory, another site, or extra
parameters; and a deployment of their own that names the owner's state directory.
The owner's real runner drives whatever is due. Nothing the attacker named is
loaded or run, every refused run is recorded in the owner's provenance as
``run_refused``, and the waiting round never launches.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from service_helpers import campaign_db, demo_copy, sqlite_rows  # type: ignore[import-not-found]

from flows._prefect._rest import request
from flows._prefect._server import ServerHandle, client_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240, func_only=True)]

NAME = "sec-authority"


@dataclass
class Owner:
    """The owner's suspended campaign, their runner, and the attacker's folder."""

    server: ServerHandle
    flow_run_id: UUID
    deployment_id: UUID
    home: Path
    spec: Path
    attacker: Path
    service: Any

    def api(self, method: str, path: str, body: Any = None) -> Any:
        return request(client_env(self.server), method, path, body)

    def drive(self) -> None:
        asyncio.run(self.service.run_once())

    def state(self, flow_run_id: UUID) -> tuple[str, str]:
        run = self.api("GET", f"flow_runs/{flow_run_id}")
        return run["state"]["type"], run["state"].get("message") or ""

    def refusals(self) -> list[tuple[str, list[str]]]:
        rows = sqlite_rows(
            campaign_db(self.home, NAME),
            "SELECT flow_run_id, details FROM campaign_event WHERE kind = 'run_refused' "
            "ORDER BY id",
        )
        return [(row[0], json.loads(row[1])["fields"]) for row in rows]

    def batches_of_round(self, index: int) -> int:
        rows = sqlite_rows(
            campaign_db(self.home, NAME),
            "SELECT COUNT(*) FROM batch WHERE round_index = ?",
            index,
        )
        return int(rows[0][0])


def _hostile_spec(folder: Path) -> Path:
    """Write the attacker's campaign (same name): its simulation leaves ``pwned`` behind."""
    marker = folder / "pwned"
    script = folder / "sim.sh"
    script.write_text(f'#!/bin/sh\ntouch "{marker}"\ncat >/dev/null\necho \'{{"value": 1.0}}\'\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return demo_copy(folder, "campaign.toml", NAME, objective__simulation=json.dumps([str(script)]))


@pytest.fixture(scope="module")
def owner(
    prefect_server: ServerHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Owner]:
    """Submit the approval demo as the owner and drive it until it waits for round 2."""
    from flows._prefect._deployment import submit_campaign
    from flows._prefect._service import CampaignService

    folder = tmp_path_factory.mktemp("authority")
    spec = demo_copy(folder / "owner", "campaign-approval.toml", NAME, rounds="3")
    home = folder / "owner" / "home"
    attacker = folder / "mallory"
    attacker.mkdir()
    saved = os.environ.get("PREFECT_LOCAL_STORAGE_PATH")
    os.environ["PREFECT_LOCAL_STORAGE_PATH"] = str(folder / "results")
    submitted = asyncio.run(submit_campaign(spec, state_dir=home))
    found = Owner(
        prefect_server,
        submitted.flow_run_id,
        submitted.deployment_id,
        home,
        spec,
        attacker,
        CampaignService(query_seconds=0.5, state_dir=home),
    )
    found.drive()
    assert found.state(submitted.flow_run_id)[0] == "PAUSED"
    try:
        yield found
    finally:
        if saved is None:
            os.environ.pop("PREFECT_LOCAL_STORAGE_PATH", None)
        else:
            os.environ["PREFECT_LOCAL_STORAGE_PATH"] = saved


def _registered(owner: Owner) -> dict[str, Any]:
    return {"spec_path": str(owner.spec.resolve()), "site": "local", "state_dir": str(owner.home)}


ATTACKS: dict[str, Any] = {
    "another-spec": lambda owner: {"spec_path": str(_hostile_spec(owner.attacker))},
    "another-state-dir": lambda owner: {"state_dir": str(owner.attacker / "fresh-home")},
    "another-site": lambda owner: {"site": str(owner.attacker / "site.toml")},
}


class TestRunsOfTheOwnersDeployment:
    @pytest.mark.parametrize("attack", sorted(ATTACKS))
    def test_a_run_with_other_parameters_executes_nothing_and_is_recorded(
        self, owner: Owner, attack: str
    ) -> None:
        """Another spec, state directory or site: refused before anything is loaded."""
        before = len(owner.refusals())
        parameters = {**_registered(owner), **ATTACKS[attack](owner)}
        created = owner.api(
            "POST",
            f"deployments/{owner.deployment_id}/create_flow_run",
            {"parameters": parameters, "tags": ["unattended", f"campaign:{NAME}"]},
        )
        owner.drive()
        state, message = owner.state(UUID(created["id"]))
        assert state == "FAILED"
        assert "run_refused" in message
        assert not (owner.attacker / "pwned").exists()
        assert not (owner.attacker / "fresh-home").exists()
        refusals = owner.refusals()
        assert len(refusals) == before + 1
        assert refusals[-1][0] == created["id"]
        assert set(refusals[-1][1]) == set(ATTACKS[attack](owner))
        # The owner's run still waits, and the waiting round has launched nothing.
        assert owner.state(owner.flow_run_id)[0] == "PAUSED"
        assert owner.batches_of_round(2) == 0

    def test_a_run_with_an_extra_parameter_executes_nothing(self, owner: Owner) -> None:
        """An unknown parameter is refused by the server's schema or by the flow."""
        from flows._prefect._rest import ServerError

        try:
            created = owner.api(
                "POST",
                f"deployments/{owner.deployment_id}/create_flow_run",
                {"parameters": {**_registered(owner), "evil": 1}},
            )
        except ServerError:
            return  # the deployment's parameter schema refused it: nothing exists to run
        before = len(owner.refusals())
        owner.drive()
        # The flow takes three parameters: Prefect's argument binding fails the run before
        # the flow's own check (Crashed); the runner's watchdog records it as refused and
        # never continues it.
        assert owner.state(UUID(created["id"]))[0] == "CRASHED"
        asyncio.run(owner.service.watchdog.sweep())
        refusals = owner.refusals()
        assert refusals[before:] == [(created["id"], ["evil"])]
        asyncio.run(owner.service.watchdog.sweep())
        assert len(owner.refusals()) == before + 1  # once
        assert owner.state(owner.flow_run_id)[0] == "PAUSED"
        assert owner.batches_of_round(2) == 0


class TestForcedAnswers:
    """Inputs planted through the API and forced states: refused, recorded, the run waits again."""

    def _pause_key(self, owner: Owner) -> str:
        run = owner.api("GET", f"flow_runs/{owner.flow_run_id}")
        return str(run["state"]["state_details"]["pause_key"])

    def _refusals(self, owner: Owner) -> list[tuple[str, str | None]]:
        rows = sqlite_rows(
            campaign_db(owner.home, NAME),
            "SELECT e.decision, e.refusal FROM approval_event e "
            "JOIN approval a ON a.id = e.approval_id WHERE a.key = ? ORDER BY e.id",
            f"{NAME}-r2-c1",
        )
        return [(row[0], row[1]) for row in rows]

    def _force_scheduled(self, owner: Owner) -> None:
        owner.api(
            "POST",
            f"flow_runs/{owner.flow_run_id}/set_state",
            {"state": {"type": "SCHEDULED", "name": "Resuming"}, "force": True},
        )

    def test_a_planted_input_the_form_cannot_read_is_refused(self, owner: Owner) -> None:
        key = self._pause_key(owner)
        before = len(self._refusals(owner))
        owner.api(
            "POST",
            f"flow_runs/{owner.flow_run_id}/input",
            {
                "key": f"suspended-{key}-response",
                "value": json.dumps({"decision": "approve", "approver": ["alice"], "x": 1}),
            },
        )
        self._force_scheduled(owner)
        owner.drive()
        assert owner.state(owner.flow_run_id)[0] == "PAUSED"
        assert self._pause_key(owner) != key  # a fresh form
        assert self._refusals(owner)[before:] == [("not_allowed", "unreadable")]
        assert owner.batches_of_round(2) == 0

    def test_a_run_forced_out_of_its_suspension_without_an_answer_waits_again(
        self, owner: Owner
    ) -> None:
        key = self._pause_key(owner)
        before = len(self._refusals(owner))
        self._force_scheduled(owner)
        owner.drive()
        assert owner.state(owner.flow_run_id)[0] == "PAUSED"
        assert self._pause_key(owner) != key
        assert self._refusals(owner)[before:] == [("not_allowed", "unreadable")]
        assert owner.batches_of_round(2) == 0


class TestForcedRunning:
    def test_a_run_forced_to_running_is_ended_as_orphaned_and_its_campaign_waits_again(
        self, owner: Owner, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Running with nothing behind it: status says when it ends, the watchdog ends it.

        The run forced out of its suspension into Running has no process and no lease.
        ``status`` says it will be ended as orphaned once the lease TTL has passed (and
        says nothing of continuing it "within 2 s" before then); the runner's watchdog,
        judging by the same rule, crashes it then and continues the campaign, whose new
        run waits for the same round's approval again: round 2 never ran unapproved.
        The owner's run is the continued one from here on (the next test approves it).
        """
        from datetime import UTC, datetime, timedelta

        from prefect.client.orchestration import get_client

        from flows._prefect._recovery_note import recovery_note

        monkeypatch.setenv("UNATTENDED_HOME", str(owner.home))  # the owner's `status`
        forced = owner.flow_run_id
        owner.api(
            "POST",
            f"flow_runs/{forced}/set_state",
            {"state": {"type": "RUNNING"}, "force": True},
        )

        async def read(run_id: UUID) -> Any:
            async with get_client() as client:
                return await client.read_flow_run(run_id)

        run = asyncio.run(read(forced))
        # Lease-less beyond a heartbeat (the short one set here): status says when it ends.
        monkeypatch.setenv("UNATTENDED_HEARTBEAT_SECONDS", "0.2")
        until = datetime.now(UTC) + timedelta(seconds=1)
        while recovery_note(run, runner_alive=True, alive=set()) is None:
            assert datetime.now(UTC) < until, "no note a heartbeat after the forced state"
        note = recovery_note(run, runner_alive=True, alive=set())
        assert note is not None
        assert "runner ends it as orphaned in" in note
        assert "within" not in note
        # A process of the runner executing it: nothing to say, nothing to do.
        assert recovery_note(run, runner_alive=True, alive={str(forced)}) is None

        ttl = owner.service.watchdog.settings.lease_ttl_seconds
        early = asyncio.run(owner.service.watchdog.sweep())
        assert not any(str(forced) in action for action in early)
        assert owner.state(forced)[0] == "RUNNING"
        later = datetime.now(UTC) + timedelta(seconds=ttl + 1)
        done = asyncio.run(owner.service.watchdog.sweep(now=later))
        assert any(action.startswith(f"crashed {forced}") for action in done), done
        (continued,) = [a for a in done if a.startswith(f"continued {NAME} as ")]
        owner.flow_run_id = UUID(continued.split(" as ")[1].split(":")[0])
        owner.drive()
        assert owner.state(forced)[0] == "CRASHED"
        assert owner.state(owner.flow_run_id)[0] == "PAUSED"
        assert owner.batches_of_round(2) == 0
        assert not (owner.attacker / "pwned").exists()


class TestDeploymentsNotRegistered:
    def test_a_deployment_naming_the_owners_state_directory_is_never_served(
        self, owner: Owner
    ) -> None:
        """A deployment made on the server by hand is not the owner's, whatever it names."""
        flow_id = owner.api("GET", f"deployments/{owner.deployment_id}")["flow_id"]
        deployment = owner.api(
            "POST",
            "deployments/",
            {
                "name": f"{NAME}-planted",
                "flow_id": flow_id,
                "entrypoint": "flows._prefect._campaign:campaign_flow",
                "parameters": {
                    "spec_path": str(_hostile_spec(owner.attacker)),
                    "site": "local",
                    "state_dir": str(owner.home),
                },
                "tags": ["unattended", f"campaign:{NAME}"],
            },
        )
        created = owner.api("POST", f"deployments/{deployment['id']}/create_flow_run", {})
        owner.drive()
        assert UUID(deployment["id"]) not in owner.service._served
        assert owner.state(UUID(created["id"]))[0] == "SCHEDULED"  # nobody runs it
        assert not (owner.attacker / "pwned").exists()
        assert owner.state(owner.flow_run_id)[0] == "PAUSED"

    def test_the_owners_run_still_completes_after_an_allowed_approval(self, owner: Owner) -> None:
        """The defences cost the owner nothing: alice approves, the campaign completes."""
        from flows._prefect._service import approve_run

        asyncio.run(approve_run(owner.flow_run_id, approver="alice"))
        owner.drive()
        assert owner.state(owner.flow_run_id)[0] == "COMPLETED"
        assert owner.batches_of_round(2) == 1
        assert not (owner.attacker / "pwned").exists()
