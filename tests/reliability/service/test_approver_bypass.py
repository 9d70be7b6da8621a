"""Nobody gets around the approver check: not the CLI, not the resume API, not a crafted input.

One campaign (the approval demo, 3 rounds) is suspended at its round-2 request on
the session's Prefect server; the tests answer it in order. Inputs the form
refuses are refused by the server and the run stays Suspended with nothing
recorded; inputs the server accepts from someone not allowed are recorded
``not_allowed`` and the run suspends again with a fresh form. Only then does
alice approve, and the run completes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import pytest
from service_helpers import campaign_db, demo_copy, sqlite_rows  # type: ignore[import-not-found]

from flows._cli import main
from flows._prefect._rest import request
from flows._prefect._server import ServerHandle, client_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180, func_only=True)]

NAME = "sec-approver"
KEY = f"{NAME}-r2-c1"


@dataclass
class Suspended:
    """The suspended campaign run every test in this module answers."""

    server: ServerHandle
    flow_run_id: UUID
    home: Path
    service: Any

    def drive(self) -> None:
        asyncio.run(self.service.run_once())

    def state(self) -> tuple[str, str | None]:
        run = request(client_env(self.server), "GET", f"flow_runs/{self.flow_run_id}")
        return run["state"]["type"], run["state"]["state_details"].get("pause_key")

    def events(self) -> list[tuple[str, str, int]]:
        return [
            (row[0], row[1], row[2])
            for row in sqlite_rows(
                campaign_db(self.home, NAME),
                "SELECT e.decided_by, e.decision, e.allowed FROM approval_event e "
                "JOIN approval a ON a.id = e.approval_id WHERE a.key = ? ORDER BY e.id",
                KEY,
            )
        ]

    def post_resume(self, body: Any) -> httpx.Response:
        return httpx.post(
            f"{self.server.api_url}/flow_runs/{self.flow_run_id}/resume",
            json=body,
            auth=self.server.basic_auth,
            timeout=30,
            verify=self.server.verify(),
        )


@pytest.fixture(scope="module")
def suspended(
    prefect_server: ServerHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Suspended]:
    """Submit the approval demo and drive it until it waits for round 2's approval."""
    import os

    from flows._prefect._deployment import submit_campaign
    from flows._prefect._service import CampaignService

    folder = tmp_path_factory.mktemp("approver")
    spec = demo_copy(folder, "campaign-approval.toml", NAME, rounds="3")
    home = folder / "home"
    saved = os.environ.get("PREFECT_LOCAL_STORAGE_PATH")
    os.environ["PREFECT_LOCAL_STORAGE_PATH"] = str(folder / "results")  # flow runs inherit it
    submitted = asyncio.run(submit_campaign(spec, state_dir=home))
    run = Suspended(
        prefect_server,
        submitted.flow_run_id,
        home,
        CampaignService(query_seconds=0.5, state_dir=home),
    )
    run.drive()
    assert run.state() == ("PAUSED", f"{KEY}-n0")
    _wait_for_schema(run, f"{KEY}-n0")
    try:
        yield run
    finally:
        if saved is None:
            os.environ.pop("PREFECT_LOCAL_STORAGE_PATH", None)
        else:
            os.environ["PREFECT_LOCAL_STORAGE_PATH"] = saved


def _wait_for_schema(run: Suspended, pause_key: str) -> None:
    """Wait until the form's schema is stored: a resume sent before it is refused."""
    url = f"{run.server.api_url}/flow_runs/{run.flow_run_id}/input/suspended-{pause_key}-schema"
    for _ in range(300):
        if (
            httpx.get(
                url, auth=run.server.basic_auth, timeout=30, verify=run.server.verify()
            ).status_code
            == httpx.codes.OK
        ):
            return
        asyncio.run(asyncio.sleep(0.1))
    raise AssertionError(f"no form schema for {pause_key}")


ALICE = {"approver": "alice", "decision": "approve"}
REFUSED_BY_THE_SERVER: dict[str, Any] = {
    "extra-field-allowed": {"run_input": {"approver": "mallory", "allowed": True}},
    "extra-field-approved-by": {"run_input": {"approver": "mallory", "approved_by": "alice"}},
    "approver-missing": {"run_input": {"decision": "approve"}},
    "approver-empty": {"run_input": {"approver": "", "decision": "approve"}},
    "approver-list": {"run_input": {"approver": ["alice"]}},
    "approver-object": {"run_input": {"approver": {"name": "alice"}}},
    "approver-number": {"run_input": {"approver": 1}},
    "approver-oversized": {"run_input": {"approver": "alice" + "x" * 200}},
    # The form's approver is a choice of the allowed names: no other name is an answer.
    "approver-not-listed": {"run_input": {"approver": "mallory", "decision": "approve"}},
    "approver-case": {"run_input": {"approver": "Alice", "decision": "approve"}},
    "approver-zero-width": {"run_input": {"approver": "alice\u200b", "decision": "approve"}},
    "approver-cyrillic": {"run_input": {"approver": "\u0430lice", "decision": "approve"}},
    "approver-two": {"run_input": {"approver": "alice, mallory", "decision": "approve"}},
    "approver-padded": {"run_input": {"approver": " alice ", "decision": "approve"}},
    "code-on-a-plain-rule": {"run_input": ALICE | {"code": "123456"}},
    "decision-upper": {"run_input": {"approver": "alice", "decision": "APPROVE"}},
    "decision-bool": {"run_input": {"approver": "alice", "decision": True}},
    "batch-size-above": {"run_input": ALICE | {"batch_size": 9}},
    "batch-size-zero": {"run_input": ALICE | {"batch_size": 0}},
    "batch-size-negative": {"run_input": ALICE | {"batch_size": -3}},
    "batch-size-text": {"run_input": ALICE | {"batch_size": "all"}},
    "input-json-string": {"run_input": json.dumps({"approver": "alice"})},
    "input-list": {"run_input": [{"approver": "alice"}]},
    "input-number": {"run_input": 1},
}


class TestRefusedByTheServer:
    @pytest.mark.parametrize("case", sorted(REFUSED_BY_THE_SERVER))
    def test_invalid_input_leaves_the_run_suspended_with_nothing_recorded(
        self, case: str, suspended: Suspended
    ) -> None:
        response = suspended.post_resume(REFUSED_BY_THE_SERVER[case])

        refused = response.status_code == httpx.codes.UNPROCESSABLE_ENTITY or (
            response.status_code == httpx.codes.OK and response.json()["status"] == "REJECT"
        )
        assert refused, (response.status_code, response.text[:300])
        assert suspended.state() == ("PAUSED", f"{KEY}-n0")
        assert suspended.events() == []


# Accepted by the form, refused by the flow: each answer re-suspends. The only name the
# form offers besides the approvers is the runner's own, for expired requests; before the
# deadline the flow refuses it, whichever route it came by.
NOT_ALLOWED = [
    ("api", "unattended:deadline"),
    ("rest", "unattended:deadline"),
]


class TestRefusedByTheCommandLine:
    def test_a_name_not_listed_exits_2_naming_the_field_and_nothing_is_recorded(
        self, suspended: Suspended, capsys: pytest.CaptureFixture[str]
    ) -> None:
        code = main(["approve", str(suspended.flow_run_id), "--as", "mallory", "--no-wait"])
        err = capsys.readouterr().err
        assert code == 2, err
        assert "'mallory' is not one of" in err
        assert suspended.state() == ("PAUSED", f"{KEY}-n0")
        assert suspended.events() == []


class TestNotAllowed:
    @pytest.mark.parametrize(("route", "approver"), NOT_ALLOWED)
    def test_is_recorded_and_the_run_suspends_again(
        self,
        route: str,
        approver: str,
        suspended: Suspended,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        refused_before = len(suspended.events())
        _wait_for_schema(suspended, f"{KEY}-n{refused_before}")
        if route == "api":
            from prefect.flow_runs import resume_flow_run

            resume_flow_run(
                suspended.flow_run_id, run_input={"approver": approver, "decision": "approve"}
            )
        else:
            body = {"run_input": {"approver": approver, "decision": "approve", "batch_size": 8}}
            assert suspended.post_resume(body).status_code == httpx.codes.CREATED

        suspended.drive()

        assert suspended.state() == ("PAUSED", f"{KEY}-n{refused_before + 1}")
        assert suspended.events()[-1] == (approver.strip(), "not_allowed", 0)
        batches = sqlite_rows(
            campaign_db(suspended.home, NAME), "SELECT COUNT(*) FROM batch WHERE round_index = 2"
        )
        assert batches == [(0,)]


class TestAllowed:
    def test_alice_approves_over_rest_and_the_run_completes_with_every_refusal_kept(
        self, suspended: Suspended
    ) -> None:
        refused = len(suspended.events())
        _wait_for_schema(suspended, f"{KEY}-n{refused}")
        body = {
            "run_input": {
                "approver": "alice",
                "decision": "approve",
                "comment": "ok",
                "batch_size": 4,
            }
        }
        assert suspended.post_resume(body).status_code == httpx.codes.CREATED

        suspended.drive()

        assert suspended.state()[0] == "COMPLETED"
        events = suspended.events()
        assert [e[1] for e in events] == ["not_allowed"] * len(NOT_ALLOWED) + ["approved"]
        assert events[-1] == ("alice", "approved", 1)
        database = campaign_db(suspended.home, NAME)
        assert sqlite_rows(database, "SELECT decided_by, decision FROM approval") == [
            ("alice", "approved")
        ]
        sizes = sqlite_rows(
            database,
            "SELECT COUNT(*) FROM task_result t JOIN batch b ON b.id = t.batch_id "
            "WHERE b.round_index = 2",
        )
        assert sizes == [(4,)]
