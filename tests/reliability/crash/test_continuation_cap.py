"""A campaign whose every run crashes stops at its continuation cap, counted across runners.

Through the real command line (``unattended submit|serve|status``) and the session's
real Prefect server. ``UNATTENDED_FAILPOINTS=campaign_start:1`` in the runner's
environment SIGKILLs every flow-run process it starts as soon as it holds the
campaign's lease (what a site prologue that always fails does to a run): the runner
marks each run *Crashed* and its watchdog continues the campaign. The continuations
are counted in the provenance, so a runner stopped and started again in between does
not start a new count; after ``UNATTENDED_MAX_CONTINUATIONS`` (the runner's setting,
here 4 instead of the default 5) the campaign is recorded ``failed`` with
``continuations_exhausted`` and no further run is started.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from crash_harness import Campaign, LoginNode, campaign_row, rows, wait_until

from flows._prefect._recovery_plan import EXHAUSTED_CODE, MAX_CONTINUATIONS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300, func_only=True)]

CAP = 4
assert CAP != MAX_CONTINUATIONS  # the setting is what counts, not the default
CRASH_EVERY_RUN = {
    "UNATTENDED_FAILPOINTS": "campaign_start:1",
    "UNATTENDED_MAX_CONTINUATIONS": str(CAP),
}


def counted_continuations(campaign: Campaign) -> int:
    found = rows(
        campaign.database,
        "SELECT count(*) FROM campaign_event WHERE kind = 'continued' "
        "AND json_extract(details, '$.counted') = 1",
    )
    return int(found[0][0]) if found else 0


@pytest.fixture
def login(login_nodes: Callable[..., LoginNode]) -> LoginNode:
    return login_nodes("crash-loop")


def test_a_campaign_crashing_on_every_run_stops_at_its_cap_across_a_runner_restart(
    login: LoginNode,
) -> None:
    campaign = login.campaign
    submitted = login.submit()
    assert submitted.returncode == 0, submitted.stderr
    login.serve(**CRASH_EVERY_RUN)
    wait_until(lambda: counted_continuations(campaign) >= 2, "two continuations")
    login.stop()
    before_restart = counted_continuations(campaign)
    assert before_restart < CAP

    login.serve(**CRASH_EVERY_RUN)
    wait_until(lambda: campaign_row(campaign) == ("failed", EXHAUSTED_CODE), "the cap")
    assert counted_continuations(campaign) == CAP  # not restarted at 0
    exhausted = rows(
        campaign.database, f"SELECT count(*) FROM campaign_event WHERE kind = '{EXHAUSTED_CODE}'"
    )
    assert exhausted == [(1,)]

    # Nothing more is started: a later sweep judged the campaign and said it left it.
    runs = login.runs()
    newest = str(runs[0]["id"])
    log = campaign.home / "runner.log"
    left = f"watchdog: left {campaign.name} failed ({EXHAUSTED_CODE}) after run {newest}"
    wait_until(lambda: left in log.read_text(), "the watchdog's decision to leave it")
    assert [r["id"] for r in login.runs()] == [r["id"] for r in runs]
    assert all(r["state"]["type"] not in {"RUNNING", "PENDING", "SCHEDULED"} for r in login.runs())

    shown = login.cli("status")
    assert f"stopped ({EXHAUSTED_CODE}): continued {CAP} times" in shown.stdout, shown.stdout
    assert "continues it within" not in shown.stdout
    print(
        f"continuation cap: {len(runs)} runs, {CAP} counted continuations "
        f"({before_restart} before the runner's restart)"
    )
