"""Approve a suspended campaign the way a person does: in the Prefect UI, in a real browser.

Real Prefect server (with its bundled UI), real runner, real provenance database,
headless Debian Chromium driven by Playwright. The form is found the way a user
finds it: the flow-run page, the page's menu, Resume.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from flows._provenance import ProvenanceStore
from flows._server import ServerHandle, flow_run_ui_url
from flows._service import CampaignService, read_run, submit_campaign

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio,
    # Setup (the session's server start, an apt-get install of chromium) is bounded by
    # its own timeouts; the slowest test took 110 s at a load average of 13 on 2 cores.
    pytest.mark.timeout(240, func_only=True),
]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "demo"
UI_TIMEOUT_MS = 60_000  # the first page load took 7 s on a busy 2-core box; allow for worse


def demo_copy(tmp_path: Path, name: str) -> Path:
    """Copy the approval demo into ``tmp_path`` as campaign ``name``; return the spec path."""
    for item in EXAMPLES.iterdir():
        shutil.copy(item, tmp_path / item.name)
    spec = tmp_path / "campaign-approval.toml"
    spec.write_text(spec.read_text().replace('name = "demo-approval"', f'name = "{name}"'))
    return spec


async def state_of(flow_run_id: UUID) -> str:
    """Return the run's state type as the API reports it (e.g. ``PAUSED``)."""
    run = await read_run(flow_run_id)
    assert run.state is not None
    return run.state.type.value


def approval_record(home: Path, name: str) -> Any:
    """Return the round-2 approval of campaign ``name`` from its provenance database."""
    store = ProvenanceStore.open(home / "campaigns" / name)
    try:
        return store.find_approval(f"{name}-r2-c1")
    finally:
        store.close()


async def suspended_campaign(tmp_path: Path, name: str) -> tuple[UUID, Path, CampaignService]:
    """Submit the demo as ``name`` and drive the runner until it waits for approval."""
    home = tmp_path / "home"
    submitted = await submit_campaign(demo_copy(tmp_path, name), state_dir=home)
    service = CampaignService(query_seconds=0.5)
    await service.run_once()
    assert await state_of(submitted.flow_run_id) == "PAUSED"
    return submitted.flow_run_id, home, service


async def open_resume_form(page: Any, url: str, *, menu_shot: Path | None = None) -> Any:
    """Open the run page, then Resume from the page's menu; return the dialog."""
    from playwright.async_api import expect

    await page.goto(url)
    await expect(page.get_by_text("Suspended").first).to_be_visible(timeout=UI_TIMEOUT_MS)
    await page.locator("main").get_by_role("button", name="Open menu").click()
    resume = page.get_by_role("menuitem", name="Resume")
    await expect(resume).to_be_visible()
    if menu_shot is not None:
        await page.screenshot(path=str(menu_shot))
    await resume.click()
    dialog = page.get_by_role("dialog")
    await expect(dialog.get_by_role("heading", name="Proposed batch")).to_be_visible(
        timeout=UI_TIMEOUT_MS
    )
    return dialog


async def fill_form(
    dialog: Any, *, approver: str, comment: str, batch_size: int | None = None
) -> None:
    """Fill in the form; the decision is left at its default (approve)."""
    await dialog.get_by_label("Approver").fill(approver)
    await dialog.get_by_label("Comment (Optional)").fill(comment)
    if batch_size is not None:
        # ``int | None`` renders as two tabs; "None" is selected until the user picks "int".
        await dialog.get_by_role("tab", name="int").click()
        await dialog.get_by_role("tabpanel").locator("input").fill(str(batch_size))


async def submit_form(page: Any, dialog: Any) -> dict[str, Any]:
    """Press Resume and return the server's answer to the UI's resume request."""
    async with page.expect_response(lambda r: r.url.endswith("/resume")) as answer:
        await dialog.get_by_role("button", name="Resume", exact=True).click()
    response = await answer.value
    body: dict[str, Any] = await response.json()
    return body


class TestApproveInTheUI:
    async def test_an_allowed_approver_resumes_the_run_to_completion(
        self, prefect_api: ServerHandle, browser_page: Any, screenshot_dir: Path, tmp_path: Path
    ) -> None:
        from playwright.async_api import expect

        name = "ui-approve"
        run_id, home, service = await suspended_campaign(tmp_path, name)
        dialog = await open_resume_form(
            browser_page,
            flow_run_ui_url(prefect_api.ui_url, run_id),
            menu_shot=screenshot_dir / "approval-menu.png",
        )
        await expect(dialog.get_by_text("review-round-2").first).to_be_visible()
        await browser_page.screenshot(path=str(screenshot_dir / "approval-request.png"))

        await fill_form(dialog, approver="alice", comment="exploit round looks sound")
        await browser_page.screenshot(path=str(screenshot_dir / "approval-form.png"))
        answer = await submit_form(browser_page, dialog)
        assert answer["status"] == "ACCEPT"
        await expect(dialog).to_be_hidden(timeout=UI_TIMEOUT_MS)

        await service.run_once()
        assert await state_of(run_id) == "COMPLETED"
        approval = approval_record(home, name)
        assert (approval.decision, approval.decided_by) == ("approved", "alice")
        assert approval.comment == "exploit round looks sound"
        assert approval.flow_run_id == str(run_id)


class TestRefusedInTheUI:
    async def test_a_batch_size_above_the_proposal_is_refused_and_the_run_stays_suspended(
        self, prefect_api: ServerHandle, browser_page: Any, screenshot_dir: Path, tmp_path: Path
    ) -> None:
        from playwright.async_api import expect

        name = "ui-refused"
        run_id, home, _service = await suspended_campaign(tmp_path, name)
        dialog = await open_resume_form(browser_page, flow_run_ui_url(prefect_api.ui_url, run_id))
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


class TestNotAllowedInTheUI:
    async def test_an_approver_not_listed_is_recorded_and_the_run_suspends_again(
        self, prefect_api: ServerHandle, browser_page: Any, tmp_path: Path
    ) -> None:
        name = "ui-mallory"
        run_id, home, service = await suspended_campaign(tmp_path, name)
        dialog = await open_resume_form(browser_page, flow_run_ui_url(prefect_api.ui_url, run_id))
        await fill_form(dialog, approver="mallory", comment="ship it")
        answer = await submit_form(browser_page, dialog)
        assert answer["status"] == "ACCEPT"  # the server only checks the form; the flow judges

        await service.run_once()
        run = await read_run(run_id)
        assert run.state is not None
        assert run.state.type.value == "PAUSED"
        assert run.state.state_details.pause_key == f"{name}-r2-c1-n1"
        approval = approval_record(home, name)
        assert approval.decision is None
        assert [(e.decision, e.decided_by, e.allowed) for e in approval.events] == [
            ("not_allowed", "mallory", False)
        ]
