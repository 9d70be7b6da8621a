"""Every approval is someone's: approvers log in as themselves and may only read and resume.

One campaign (the approval demo, 3 rounds; rule approvers alice and bob) waits at its
round-2 request on the session's real Prefect server, behind the server's identity
layer. The tests act on it in order, as a hostile co-approver would, then alice
approves with her own login and the answer is recorded as hers. Each test failed
before the identity layer: every co-approver held the owner's one secret.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import pytest
from service_helpers import campaign_db, demo_copy, sqlite_rows  # type: ignore[import-not-found]

from flows._cli import main
from flows._prefect._identity_logins import ApproverLogins, logins_path
from flows._prefect._rest import request
from flows._prefect._server import ServerHandle, client_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240, func_only=True)]

NAME = "sec-identity"
KEY = f"{NAME}-r2-c1"


@dataclass
class Waiting:
    """The suspended campaign run every test in this module acts on, and the logins."""

    server: ServerHandle
    flow_run_id: UUID
    deployment_id: str
    home: Path
    service: Any
    logins: dict[str, tuple[str, str]] = field(default_factory=dict)

    def drive(self) -> None:
        asyncio.run(self.service.run_once())

    def state(self, run: UUID | None = None) -> tuple[str, str | None]:
        found = request(client_env(self.server), "GET", f"flow_runs/{run or self.flow_run_id}")
        return found["state"]["type"], found["state"]["state_details"].get("pause_key")

    def call(self, who: str, method: str, path: str, body: Any = None) -> httpx.Response:
        auth = self.server.basic_auth if who == "owner" else self.logins[who]
        return httpx.request(
            method,
            f"{self.server.api_url}/{path}",
            json=body,
            auth=auth,
            timeout=60,
            verify=self.server.verify(),
        )

    def events(self, kind: str) -> list[tuple[Any, ...]]:
        return sqlite_rows(
            campaign_db(self.home, NAME),
            "SELECT flow_run_id, actor, details FROM campaign_event WHERE kind = ? ORDER BY id",
            kind,
        )

    def answers(self) -> list[tuple[Any, ...]]:
        return sqlite_rows(
            campaign_db(self.home, NAME),
            "SELECT e.decided_by, e.decision, e.allowed, e.proof FROM approval_event e "
            "JOIN approval a ON a.id = e.approval_id WHERE a.key = ? ORDER BY e.id",
            KEY,
        )


@pytest.fixture(scope="module")
def waiting(
    prefect_server: ServerHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Waiting]:
    """Submit the approval demo, drive it to round 2's request, give alice, bob, carol logins."""
    from flows._prefect._deployment import submit_campaign
    from flows._prefect._service import CampaignService

    folder = tmp_path_factory.mktemp("identity")
    spec = demo_copy(folder, "campaign-approval.toml", NAME, rounds="3")
    home = folder / "home"
    saved = os.environ.get("PREFECT_LOCAL_STORAGE_PATH")
    os.environ["PREFECT_LOCAL_STORAGE_PATH"] = str(folder / "results")  # flow runs inherit it
    submitted = asyncio.run(submit_campaign(spec, state_dir=home))
    run = Waiting(
        prefect_server,
        submitted.flow_run_id,
        str(submitted.deployment_id),
        home,
        CampaignService(query_seconds=0.5, state_dir=home),
    )
    logins = ApproverLogins(logins_path(prefect_server.prefect_home))
    for name in ("alice", "bob", "carol"):  # carol logs in, but no rule names her
        run.logins[name] = (name, logins.add(name, replace=True, created_at="test"))
    run.drive()
    assert run.state() == ("PAUSED", f"{KEY}-n0")
    try:
        yield run
    finally:
        for name in run.logins:
            logins.remove(name)
        if saved is None:
            os.environ.pop("PREFECT_LOCAL_STORAGE_PATH", None)
        else:
            os.environ["PREFECT_LOCAL_STORAGE_PATH"] = saved


class TestWhatAnApproverMayNotDo:
    def test_reading_the_runs_answers_is_refused(self, waiting: Waiting) -> None:
        base = f"flow_runs/{waiting.flow_run_id}"
        assert waiting.call("alice", "GET", base).status_code == httpx.codes.OK
        # The form the UI shows (schema, description) is readable; an answer never is.
        form = waiting.call("alice", "GET", f"{base}/input/suspended-{KEY}-n0-schema")
        assert form.status_code == httpx.codes.OK
        owner = waiting.call("owner", "POST", f"{base}/input", {"key": "x-response", "value": "1"})
        assert owner.status_code == httpx.codes.CREATED  # an input only the owner may read
        answer = waiting.call("alice", "GET", f"{base}/input/x-response")
        listed = waiting.call("alice", "POST", f"{base}/input/filter", {"prefix": "x"})

        assert answer.status_code == httpx.codes.FORBIDDEN
        assert "approver_allowlist" in answer.json()["detail"]
        assert listed.status_code == httpx.codes.FORBIDDEN
        assert waiting.call("owner", "GET", f"{base}/input/x-response").status_code == 200

    def test_creating_a_run_or_setting_a_state_is_refused(self, waiting: Waiting) -> None:
        created = waiting.call(
            "alice", "POST", f"deployments/{waiting.deployment_id}/create_flow_run", {}
        )
        forced = waiting.call(
            "bob",
            "POST",
            f"flow_runs/{waiting.flow_run_id}/set_state",
            {"state": {"type": "SCHEDULED"}, "force": True},
        )

        assert created.status_code == httpx.codes.FORBIDDEN
        assert forced.status_code == httpx.codes.FORBIDDEN
        assert waiting.state() == ("PAUSED", f"{KEY}-n0")

    def test_an_approver_no_rule_names_cannot_resume(self, waiting: Waiting) -> None:
        body = {"run_input": {"decision": "approve"}}
        refused = waiting.call("carol", "POST", f"flow_runs/{waiting.flow_run_id}/resume", body)

        assert refused.status_code == httpx.codes.FORBIDDEN
        assert "approver_not_named_by_rule" in refused.json()["detail"]
        assert waiting.state() == ("PAUSED", f"{KEY}-n0")

    def test_answering_as_another_approver_is_refused_and_recorded(self, waiting: Waiting) -> None:
        body = {"run_input": {"approver": "bob", "decision": "approve"}}
        refused = waiting.call("alice", "POST", f"flow_runs/{waiting.flow_run_id}/resume", body)

        assert refused.status_code == httpx.codes.FORBIDDEN
        assert "approver_is_who_logged_in" in refused.json()["detail"]
        assert waiting.state() == ("PAUSED", f"{KEY}-n0")
        assert [(run, actor) for run, actor, _ in waiting.events("answer_refused")] == [
            (str(waiting.flow_run_id), "alice")
        ]
        assert waiting.answers() == []  # no answer reached the run


class TestOneLiveRunPerCampaign:
    def test_a_clone_with_identical_parameters_never_waits_on_the_request(
        self, waiting: Waiting
    ) -> None:
        parameters = request(client_env(waiting.server), "GET", f"flow_runs/{waiting.flow_run_id}")[
            "parameters"
        ]
        clone = waiting.call(
            "owner",
            "POST",
            f"deployments/{waiting.deployment_id}/create_flow_run",
            {"parameters": parameters},
        )
        assert clone.status_code == httpx.codes.CREATED, clone.text[:300]
        clone_id = UUID(clone.json()["id"])

        waiting.drive()

        assert waiting.state(clone_id)[0] == "CANCELLED"
        assert [run for run, _, _ in waiting.events("clone_refused")] == [str(clone_id)]
        assert waiting.state() == ("PAUSED", f"{KEY}-n0")  # the original's form is untouched
        body = {"run_input": {"decision": "approve"}}
        to_clone = waiting.call("alice", "POST", f"flow_runs/{clone_id}/resume", body)
        assert to_clone.status_code == httpx.codes.FORBIDDEN


class TestLogins:
    def test_a_login_made_and_revoked_takes_effect_at_once(
        self,
        waiting: Waiting,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        monkeypatch.setenv("UNATTENDED_HOME", str(waiting.server.prefect_home.parent))
        assert main(["approvers", "add", "dave"]) == 0
        login = next(
            line.strip() for line in capsys.readouterr().out.splitlines() if "dave:" in line
        )
        waiting.logins["dave"] = tuple(login.split(":", 1))  # type: ignore[assignment]
        path = f"flow_runs/{waiting.flow_run_id}"
        stored = logins_path(waiting.server.prefect_home).read_text()
        assert login.split(":", 1)[1] not in stored  # only a hash is kept
        assert oct(logins_path(waiting.server.prefect_home).stat().st_mode & 0o777) == "0o600"
        assert waiting.call("dave", "GET", path).status_code == httpx.codes.OK

        assert main(["approvers", "remove", "dave"]) == 0

        assert waiting.call("dave", "GET", path).status_code == httpx.codes.UNAUTHORIZED
        capsys.readouterr()
        assert main(["approvers", "list"]) == 0
        assert "dave" not in capsys.readouterr().out


class TestAnswerIsWhoLoggedIn:
    def test_the_command_line_answering_as_another_approver_is_refused(
        self,
        waiting: Waiting,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        monkeypatch.setenv("PREFECT_API_AUTH_STRING", ":".join(waiting.logins["bob"]))
        code = main(["approve", str(waiting.flow_run_id), "--as", "alice", "--no-wait"])

        err = capsys.readouterr().err
        assert code != 0
        assert "approver_is_who_logged_in" in err, err
        assert waiting.state() == ("PAUSED", f"{KEY}-n0")
        assert [actor for _, actor, _ in waiting.events("answer_refused")] == ["alice", "bob"]

    def test_alices_answer_is_recorded_as_her_login_and_then_unreadable(
        self, waiting: Waiting
    ) -> None:
        body = {"run_input": {"decision": "approve", "authenticated_as": "owner"}}
        accepted = waiting.call("alice", "POST", f"flow_runs/{waiting.flow_run_id}/resume", body)
        assert accepted.status_code == httpx.codes.CREATED, accepted.text[:300]

        waiting.drive()

        assert waiting.state()[0] == "COMPLETED"
        assert waiting.answers() == [("alice", "approved", 1, "login")]
        answer = waiting.call(
            "owner", "GET", f"flow_runs/{waiting.flow_run_id}/input/suspended-{KEY}-n0-response"
        )
        assert answer.status_code == httpx.codes.NOT_FOUND  # read once by the flow, then deleted


async def _socket_auth(server: ServerHandle, path: str, token: str) -> str:
    """Open a websocket as Prefect's clients do (subprotocol, then an auth message)."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    url = server.api_url.replace("https://", "wss://").replace("http://", "ws://") + path
    tls = server.verify()  # the server's own certificate, pinned
    async with connect(
        url,
        subprotocols=["prefect"],  # type: ignore[list-item]
        ssl=tls if isinstance(tls, ssl.SSLContext) else None,
    ) as socket:
        await socket.send(json.dumps({"type": "auth", "token": token}))
        try:
            return str(json.loads(await asyncio.wait_for(socket.recv(), 60))["type"])
        except ConnectionClosed as closed:
            return f"closed {closed.rcvd.code if closed.rcvd else '?'}"


class TestLiveStreams:
    def test_an_approver_reads_the_event_stream_but_sends_no_events(self, waiting: Waiting) -> None:
        login = ":".join(waiting.logins["bob"])
        owner = waiting.server.auth_string or ""

        assert asyncio.run(_socket_auth(waiting.server, "/events/out", login)) == "auth_success"
        assert asyncio.run(_socket_auth(waiting.server, "/events/in", login)) == "closed 1008"
        assert asyncio.run(_socket_auth(waiting.server, "/events/in", owner)) == "auth_success"


class TestFailedLogins:
    def test_are_limited_to_a_few_a_second_and_a_known_login_still_works(
        self, waiting: Waiting
    ) -> None:
        url = f"{waiting.server.api_url}/flow_runs/{waiting.flow_run_id}"
        codes = [
            httpx.get(
                url, auth=("alice", f"wrong-{i}"), timeout=60, verify=waiting.server.verify()
            ).status_code
            for i in range(12)
        ]

        assert codes[0] == httpx.codes.UNAUTHORIZED
        assert codes.count(httpx.codes.TOO_MANY_REQUESTS) >= 6, codes
        assert waiting.call("owner", "GET", f"flow_runs/{waiting.flow_run_id}").status_code == 200
        assert waiting.call("alice", "GET", f"flow_runs/{waiting.flow_run_id}").status_code == 200

    def test_a_forwarded_address_per_guess_does_not_escape_the_limit(
        self, waiting: Waiting
    ) -> None:
        url = f"{waiting.server.api_url}/flow_runs/{waiting.flow_run_id}"
        codes = [
            httpx.get(
                url,
                auth=("alice", f"wrong-{i}"),
                headers={"X-Forwarded-For": f"10.0.0.{i}"},  # uvicorn trusts it from 127.0.0.1
                timeout=60,
                verify=waiting.server.verify(),
            ).status_code
            for i in range(12)
        ]

        assert codes.count(httpx.codes.TOO_MANY_REQUESTS) >= 6, codes
