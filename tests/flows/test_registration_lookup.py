"""Finding a run's registration by its deployment: right after every change, one file read.

The registration is the only authority over what a campaign's run executes, so the
lookup must never answer from a stale memory: a resubmitted, deleted or rewritten
registration is what counts at once. And ``status`` looks one up per running campaign,
so a known deployment must cost one file, not all of them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from flows._engine import _registration
from flows._engine._registration import Registration, registration_for, write_registration
from flows._paths import campaign_dir


def register(home: Path, campaign: str, deployment: str) -> Registration:
    registration = Registration(
        campaign, f"/specs/{campaign}.toml", "local", str(home), deployment, f"{campaign}@u-k"
    )
    campaign_dir(home, campaign).mkdir(parents=True, exist_ok=True)
    write_registration(home, registration)
    return registration


def campaign_of(home: Path, deployment: str) -> str | None:
    found = registration_for(home, deployment)
    return None if found is None else found.campaign


@pytest.fixture
def home(tmp_path: Path) -> Path:
    for index in range(30):
        register(tmp_path, f"c{index:02d}", f"dep-{index:02d}")
    return tmp_path


def test_each_deployment_finds_its_own_registration_and_a_stranger_none(home: Path) -> None:
    for index in (7, 3, 29, 7):
        assert campaign_of(home, f"dep-{index:02d}") == f"c{index:02d}"
    assert campaign_of(home, "dep-stranger") is None


def test_a_resubmitted_campaign_answers_for_its_new_deployment_only(home: Path) -> None:
    assert campaign_of(home, "dep-05") == "c05"  # remembered where it is
    register(home, "c05", "dep-05b")
    assert campaign_of(home, "dep-05") is None
    assert campaign_of(home, "dep-05b") == "c05"


def test_a_registration_rewritten_in_place_is_read_again(home: Path) -> None:
    assert campaign_of(home, "dep-06") == "c06"
    path = _registration.registration_path(home, "c06")
    # The same size, the same inode, within the same clock tick: only reading tells.
    path.write_text(path.read_text().replace("dep-06", "dep-60"))
    assert campaign_of(home, "dep-06") is None
    assert campaign_of(home, "dep-60") == "c06"


def test_a_deleted_registration_is_gone_at_once(home: Path) -> None:
    assert campaign_of(home, "dep-08") == "c08"
    _registration.registration_path(home, "c08").unlink()
    assert campaign_of(home, "dep-08") is None


def test_a_known_deployment_costs_one_file_read(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registration_for(home, "dep-00")  # the first lookup reads them all
    reads: list[Path] = []
    parse = _registration._parse

    def counting(path: Path) -> Registration | None:
        reads.append(path)
        return parse(path)

    monkeypatch.setattr(_registration, "_parse", counting)
    for index in range(30):
        assert registration_for(home, f"dep-{index:02d}") is not None
    assert len(reads) == 30
