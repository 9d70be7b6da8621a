"""Approve a suspended campaign the way a person does: in the Prefect UI, in a real browser.

Real Prefect server (with its bundled UI), real runner, real provenance database,
headless Debian Chromium driven by Playwright. The form is found the way a user
finds it: the flow-run page, the page's menu, Resume.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit
from uuid import UUID

import pyotp
import pytest

from flows._engine._proof import ApproverCodes
from flows._paths import approvers_dir
from flows._prefect._deployment import submit_campaign
from flows._prefect._identity_logins import ApproverLogins, logins_path
from flows._prefect._server import ServerHandle, flow_run_ui_url
from flows._prefect._service import CampaignService, read_run
from flows._provenance import ProvenanceStore

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio,
    # Setup (the session's server start, an apt-get install of chromium) is bounded by
    # its own timeouts; the slowest test took 110 s at a load average of 13 on 2 cores.
    pytest.mark.timeout(240, func_only=True),
]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "demo"
UI_TIMEOUT_MS = 60_000  # the first page load took 7 s on a busy 2-core box; allow for worse
PICK_TIMEOUT_MS = 10_000  # a click on an option that waits longer is dispatched instead


def demo_copy(tmp_path: Path, name: str, *, require_proof: bool = False) -> Path:
    """Copy the approval demo into ``tmp_path`` as campaign ``name``; return the spec path."""
    for item in EXAMPLES.iterdir():
        shutil.copy(item, tmp_path / item.name)
    if require_proof:
        policy = tmp_path / "approval-policy.toml"
        rule = 'approvers = ["alice", "bob"]\n'
        policy.write_text(policy.read_text().replace(rule, rule + "require_proof = true\n"))
    spec = tmp_path / "campaign-approval.toml"
    spec.write_text(spec.read_text().replace('name = "demo-approval"', f'name = "{name}"'))
    return spec


async def state_of(flow_run_id: UUID) -> str:
    """Return the run's state type as the API reports it (e.g. ``PAUSED``)."""
    run = await read_run(flow_run_id)
    assert run.state is not None
    return run.state.type.value


def round_view(home: Path, name: str, index: int) -> dict[str, Any]:
    """Return round ``index`` of campaign ``name`` as the provenance database holds it."""
    store = ProvenanceStore.open(home / "campaigns" / name)
    try:
        return store.round_view(name, index)
    finally:
        store.close()


def approval_record(home: Path, name: str) -> Any:
    """Return the round-2 approval of campaign ``name`` from its provenance database."""
    store = ProvenanceStore.open(home / "campaigns" / name)
    try:
        return store.find_approval(f"{name}-r2-c1")
    finally:
        store.close()


async def suspended_campaign(
    tmp_path: Path, name: str, *, require_proof: bool = False
) -> tuple[UUID, Path, CampaignService]:
    """Submit the demo as ``name`` and drive the runner until it waits for approval."""
    home = tmp_path / "home"
    spec = demo_copy(tmp_path, name, require_proof=require_proof)
    submitted = await submit_campaign(spec, state_dir=home)
    service = CampaignService(query_seconds=0.5, state_dir=home)
    await service.run_once()
    assert await state_of(submitted.flow_run_id) == "PAUSED"
    return submitted.flow_run_id, home, service


async def log_in(page: Any, server: ServerHandle, *, secret: str | None = None) -> Any:
    """Open the UI and answer its login prompt with ``secret`` (the server's by default).

    Returns the prompt's field (hidden once the secret was taken).
    """
    from playwright.async_api import expect

    await page.goto(f"{server.ui_url}/v2")
    field = page.get_by_placeholder("admin:pass")
    await expect(field).to_be_visible(timeout=UI_TIMEOUT_MS)
    await field.fill(secret if secret is not None else server.auth_string or "")
    await page.get_by_role("button", name="Login").click()
    return field


async def open_resume_form(
    page: Any,
    server: ServerHandle,
    run_id: UUID,
    *,
    menu_shot: Path | None = None,
    logged_in: bool = False,
    login: str | None = None,
) -> Any:
    """Log in (once; ``login`` or the owner's), open the run page, Resume; return the dialog."""
    from playwright.async_api import expect

    if not logged_in:
        field = await log_in(page, server, secret=login)
        await expect(field).to_be_hidden(timeout=UI_TIMEOUT_MS)
    await page.goto(flow_run_ui_url(server.ui_url, run_id))
    await expect(page.get_by_text("Suspended").first).to_be_visible(timeout=UI_TIMEOUT_MS)
    await page.locator("main").get_by_role("button", name="Open menu").click()
    resume = page.get_by_role("menuitem", name="Resume")
    await expect(resume).to_be_visible()
    if menu_shot is not None:
        await page.screenshot(path=str(menu_shot))
    await resume.click()
    dialog = page.get_by_role("dialog")
    await expect(dialog.get_by_text("Why it asks")).to_be_visible(timeout=UI_TIMEOUT_MS)
    return dialog


async def pick(dialog: Any, field: str, option: str) -> None:
    """Choose ``option`` in the select labelled ``field`` (Decision, Approver)."""
    from playwright.async_api import Error as PlaywrightError
    from playwright.async_api import expect

    await dialog.get_by_role("button", name=f"Select {field}").click()
    choice = dialog.page.get_by_role("option", name=option, exact=True)
    try:
        await choice.click(timeout=PICK_TIMEOUT_MS)
    except PlaywrightError:
        # On a loaded machine the open list can be re-rendered under the pointer for as
        # long as the click waits ("element is not stable", "detached from the DOM"),
        # where a person's click lands all the same: click the option where it is now.
        if await dialog.page.get_by_role("listbox").is_visible():
            await choice.dispatch_event("click")
    # Choosing closes the list; a click that did not choose leaves it open and fails here.
    await expect(dialog.page.get_by_role("listbox")).to_be_hidden()


async def fill_form(
    dialog: Any,
    *,
    approver: str,
    comment: str,
    batch_size: int | None = None,
    decision: str = "approve",
    code: str | None = None,
    candidates: tuple[int, ...] = (),
) -> None:
    """Fill in the form: the decision (it has no default), name, code, subset, comment."""
    await pick(dialog, "Decision", decision)
    await pick(dialog, "Approver", approver)
    if code is not None:
        await dialog.get_by_label("Code", exact=True).fill(code)
    if candidates:
        await pick_candidates(dialog, candidates)
    if batch_size is not None:
        await dialog.get_by_label("Batch Size (Optional)").fill(str(batch_size))
    await dialog.get_by_label("Comment (Optional)").fill(comment)


async def pick_candidates(dialog: Any, indices: tuple[int, ...]) -> None:
    """Pick rows ``indices`` in the Candidates select (one option per row, ``#i: (...)``)."""
    from playwright.async_api import expect

    select = dialog.get_by_role("button", name="Select Candidates")
    for index in indices:
        option = dialog.page.get_by_role("option", name=re.compile(rf"^#{index}: "))
        if not await option.is_visible():
            await select.click()
        await option.click()
    if await dialog.page.get_by_role("listbox").is_visible():
        await select.click()  # fold the list again, as a user does
    await expect(dialog.page.get_by_role("listbox")).to_be_hidden()


async def submit_form(page: Any, dialog: Any) -> dict[str, Any]:
    """Press Resume and return the server's answer to the UI's resume request.

    Prefect on SQLite answers 503 ("database is locked") when its own background writes
    meet the request (seen once in a CI run); the run stays Suspended and the user
    presses Resume again, as ``docs/approvals.md`` says. So does this, twice at most.
    """
    for _ in range(3):
        async with page.expect_response(lambda r: r.url.endswith("/resume")) as answer:
            await dialog.get_by_role("button", name="Resume", exact=True).click()
        response = await answer.value
        if response.status != 503:
            break
    body: dict[str, Any] = await response.json()
    assert response.ok, (response.status, body)
    return body


class TestTheUIAsksForTheSecret:
    async def test_a_wrong_secret_is_refused_and_the_server_s_secret_lets_you_in(
        self, prefect_api: ServerHandle, browser_page: Any, screenshot_dir: Path
    ) -> None:
        from playwright.async_api import expect

        field = await log_in(browser_page, prefect_api, secret="unattended:guessed")
        refusal = browser_page.locator("p.text-destructive")  # the login form's error line
        await expect(refusal).to_be_visible(timeout=UI_TIMEOUT_MS)
        await browser_page.screenshot(path=str(screenshot_dir / "approval-login.png"))
        await expect(field).to_be_visible()  # still asking
        await field.fill(prefect_api.auth_string or "")
        await browser_page.get_by_role("button", name="Login").click()
        await expect(field).to_be_hidden(timeout=UI_TIMEOUT_MS)
        await expect(browser_page.get_by_text("Runs").first).to_be_visible(timeout=UI_TIMEOUT_MS)


async def expect_fully_in_view(*targets: Any) -> None:
    """Expect each target wholly inside the window as it is (nothing scrolled)."""
    from playwright.async_api import expect

    for target in targets:
        await expect(target).to_be_in_viewport(ratio=1)


class TestApproveInTheUI:
    async def test_the_fields_show_without_scrolling_and_the_approver_is_picked(
        self, prefect_api: ServerHandle, browser_page: Any, screenshot_dir: Path, tmp_path: Path
    ) -> None:
        """At 1400x1000 the dialog opens on the fields; the approver is a choice of names."""
        from playwright.async_api import expect

        name = "ui-approve"
        run_id, home, service = await suspended_campaign(tmp_path, name)
        # alice logs in as herself (`unattended approvers add alice`), not with the owner's secret.
        logins = ApproverLogins(logins_path(prefect_api.prefect_home))
        login = f"alice:{logins.add('alice', replace=True, created_at='test')}"
        dialog = await open_resume_form(
            browser_page,
            prefect_api,
            run_id,
            menu_shot=screenshot_dir / "approval-menu.png",
            login=login,
        )
        decision = dialog.get_by_role("button", name="Select Decision")
        approver = dialog.get_by_role("button", name="Select Approver")
        resume = dialog.get_by_role("button", name="Resume", exact=True)
        await expect_fully_in_view(decision, approver, resume)
        # What each answer does, said once; why in words, the condition once; no code field.
        await expect(dialog.get_by_text("Reject", exact=True)).to_have_count(1)
        await expect(dialog.get_by_text("Why it asks")).to_be_visible()
        await expect(dialog.get_by_text("round.index == 2", exact=True)).to_have_count(1)
        await expect(dialog.get_by_text("Code", exact=True)).to_have_count(0)
        await expect(dialog.get_by_text("Decision (Optional)")).to_have_count(0)
        await browser_page.screenshot(path=str(screenshot_dir / "approval-request.png"))
        # Folded below: the rationale, the predictions, the best so far and both costs.
        details = dialog.get_by_text("Details: rationale, predictions")
        await details.click()
        for shown in ("Planner's rationale:", "Best result so far:", "Cost:"):
            await expect(dialog.get_by_text(shown)).to_be_visible()
        await expect(dialog.get_by_text("; the fallback batch 0.08")).to_be_visible()
        await expect(dialog.get_by_role("columnheader", name="verifier predicts")).to_be_visible()
        await browser_page.screenshot(path=str(screenshot_dir / "approval-details.png"))
        await details.click()

        await approver.click()
        offered = await browser_page.get_by_role("option").all_inner_texts()
        assert [text.strip() for text in offered] == ["alice", "bob", "unattended:deadline"]
        await browser_page.keyboard.press("Escape")
        await fill_form(dialog, approver="alice", comment="exploit round looks sound")
        await expect_fully_in_view(resume)
        await browser_page.screenshot(path=str(screenshot_dir / "approval-form.png"))
        answer = await submit_form(browser_page, dialog)
        assert answer["status"] == "ACCEPT"
        await expect(dialog).to_be_hidden(timeout=UI_TIMEOUT_MS)

        await service.run_once()
        assert await state_of(run_id) == "COMPLETED"
        approval = approval_record(home, name)
        assert (approval.decision, approval.decided_by) == ("approved", "alice")
        assert approval.events[-1].proof == "login"  # the server authenticated alice herself
        assert approval.comment == "exploit round looks sound"
        assert approval.flow_run_id == str(run_id)
        logins.remove("alice")


# A row as the Candidates select offers it: its #, coordinates, the verifier's prediction.
ROW = re.compile(r"^#(?P<index>\d+): \((?P<point>[^)]*)\), predicted (?P<predicted>\S+)$")


class TestApproveASubsetInTheUI:
    async def test_the_picked_rows_run_and_the_others_are_struck_in_the_approver_s_name(
        self, prefect_api: ServerHandle, browser_page: Any, screenshot_dir: Path, tmp_path: Path
    ) -> None:
        """Rows show coordinates and prediction; the batch that runs is exactly the rows picked."""
        from playwright.async_api import expect

        name = "ui-subset"
        chosen = (5, 0, 2)  # picked out of order: the batch keeps its own order
        run_id, home, service = await suspended_campaign(tmp_path, name)
        dialog = await open_resume_form(browser_page, prefect_api, run_id)
        # One select of the batch's rows, each with its coordinates and prediction.
        await dialog.get_by_role("button", name="Select Candidates").click()
        offered = [t.strip() for t in await browser_page.get_by_role("option").all_inner_texts()]
        rows = [ROW.match(text) for text in offered]
        assert all(rows), offered
        assert [int(row["index"]) for row in rows if row] == list(range(8))
        shown = {int(row["index"]): row["point"] for row in rows if row}
        await browser_page.keyboard.press("Escape")
        await expect(dialog.get_by_text('Property is type "None"')).to_have_count(0)

        await fill_form(dialog, approver="alice", comment="only the safe ones", candidates=chosen)
        for index in chosen:  # the picked rows show as chips, above the footer
            await expect(dialog.get_by_text(offered[index], exact=True)).to_be_in_viewport()
        await browser_page.screenshot(path=str(screenshot_dir / "approval-subset.png"))
        answer = await submit_form(browser_page, dialog)
        assert answer["status"] == "ACCEPT"
        await expect(dialog).to_be_hidden(timeout=UI_TIMEOUT_MS)

        await service.run_once()
        assert await state_of(run_id) == "COMPLETED"
        approval = approval_record(home, name)
        assert (approval.decision, approval.decided_by) == ("approved", "alice")
        assert approval.events[-1].overrides == {"candidates": list(chosen)}
        view = round_view(home, name, 2)
        fates = {
            c["candidate_index"]: (c["fate"], c["actor"])
            for c in view["candidates"]
            if c["source"] == "proposal"
        }
        assert fates == {
            i: ("launched", None) if i in chosen else ("struck", "alice") for i in range(8)
        }
        struck = [c["reason"] for c in view["candidates"] if c["fate"] == "struck"]
        assert struck == ["struck by approver alice"] * 5
        # The tasks that ran are the rows the approver picked, in batch order.
        (batch,) = view["batches"]
        ran = [r["candidate"] for r in sorted(batch["results"], key=lambda r: r["index"])]
        assert [", ".join(f"{x:.4g}" for x in c) for c in ran] == [shown[i] for i in sorted(chosen)]
        assert {r["status"] for r in batch["results"]} == {"done"}


class TestRefusedInTheUI:
    async def test_a_batch_size_above_the_proposal_is_refused_and_the_run_stays_suspended(
        self, prefect_api: ServerHandle, browser_page: Any, screenshot_dir: Path, tmp_path: Path
    ) -> None:
        from playwright.async_api import expect

        name = "ui-refused"
        run_id, home, _service = await suspended_campaign(tmp_path, name)
        dialog = await open_resume_form(browser_page, prefect_api, run_id)
        await fill_form(dialog, approver="alice", comment="more please", batch_size=9)
        answer = await submit_form(browser_page, dialog)

        assert answer["status"] == "REJECT"
        refusal = browser_page.get_by_text("Validation failed for field 'batch_size'")
        await expect(refusal).to_be_visible(timeout=UI_TIMEOUT_MS)
        await expect(refusal).to_contain_text("greater than the maximum of 8")
        await browser_page.screenshot(path=str(screenshot_dir / "approval-refused.png"))
        assert await state_of(run_id) == "PAUSED"
        approval = approval_record(home, name)
        assert approval.decision is None
        assert approval.events == ()


class TestACodeProtectedRule:
    @pytest.mark.timeout(480, func_only=True)  # two answers, two flow-run restarts
    async def test_a_wrong_code_is_refused_and_the_right_one_accepted(
        self, prefect_api: ServerHandle, browser_page: Any, screenshot_dir: Path, tmp_path: Path
    ) -> None:
        from playwright.async_api import expect

        name = "ui-proof"
        codes = ApproverCodes(approvers_dir(tmp_path / "home"))
        totp = pyotp.TOTP(parse_qs(urlsplit(codes.enroll("alice")).query)["secret"][0])
        run_id, home, service = await suspended_campaign(tmp_path, name, require_proof=True)
        dialog = await open_resume_form(browser_page, prefect_api, run_id)
        await expect(dialog.get_by_text("This rule requires proof:")).to_be_visible()
        await expect_fully_in_view(dialog.get_by_label("Code", exact=True))
        wrong = f"{(int(totp.now()) + 1) % 1_000_000:06d}"
        await fill_form(dialog, approver="alice", comment="wrong code", code=wrong)
        await browser_page.screenshot(path=str(screenshot_dir / "approval-code.png"))
        assert (await submit_form(browser_page, dialog))["status"] == "ACCEPT"

        await service.run_once()
        run = await read_run(run_id)
        assert run.state is not None
        assert run.state.state_details.pause_key == f"{name}-r2-c1-n1"  # waits again
        events = approval_record(home, name).events
        assert [(e.decision, e.proof) for e in events] == [("not_allowed", "totp failed")]

        dialog = await open_resume_form(browser_page, prefect_api, run_id, logged_in=True)
        await fill_form(dialog, approver="alice", comment="right code", code=totp.now())
        assert (await submit_form(browser_page, dialog))["status"] == "ACCEPT"
        await service.run_once()
        assert await state_of(run_id) == "COMPLETED"
        approval = approval_record(home, name)
        assert (approval.decision, approval.events[-1].proof) == ("approved", "totp ok")


class TestTheRunPageShowsTheStory:
    async def test_the_artifacts_tab_shows_the_round_table_the_batch_and_the_evidence(
        self, prefect_api: ServerHandle, browser_page: Any, screenshot_dir: Path, tmp_path: Path
    ) -> None:
        """A waiting run's Artifacts tab lists its artifacts; the evidence opens in words."""
        from playwright.async_api import expect

        from flows._prefect._artifact_views import artifact_key

        name = "ui-artifacts"
        run_id, _home, _service = await suspended_campaign(tmp_path, name)
        await expect(await log_in(browser_page, prefect_api)).to_be_hidden(timeout=UI_TIMEOUT_MS)
        await browser_page.goto(flow_run_ui_url(prefect_api.ui_url, run_id))
        await browser_page.get_by_role("tab", name="Artifacts").click()
        main = browser_page.locator("main")
        for what in ("rounds", "batch", "approval"):
            shown = main.get_by_text(artifact_key(name, what), exact=True)
            await expect(shown.first).to_be_visible(timeout=UI_TIMEOUT_MS)
        await browser_page.screenshot(path=str(screenshot_dir / "run-artifacts.png"))
        await main.get_by_text(artifact_key(name, "approval"), exact=True).first.click()
        page = browser_page.locator("main")
        await expect(page.get_by_text("waits for approval").first).to_be_visible(
            timeout=UI_TIMEOUT_MS
        )
        await expect(page.get_by_text("What the fallback would run instead")).to_be_visible()
        await expect(
            page.get_by_text(f"unattended approve {run_id} --as NAME").first
        ).to_be_visible()
        await browser_page.screenshot(path=str(screenshot_dir / "run-approval-evidence.png"))
