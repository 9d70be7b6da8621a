"""Running a completed campaign again shows its stored record, whatever its [notify] URLs."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import pytest

from flows._cli._submit import show_stored_completion
from flows._provenance import ProvenanceStore

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "demo"
HOOK = "https://hooks.example.org/services/T000/B000/s3cr3t-t0k3n"


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    """The demo spec, named ``stored``, with a webhook whose URL carries a token."""
    for item in EXAMPLES.iterdir():
        if item.is_file():
            shutil.copy(item, tmp_path / item.name)
    path = tmp_path / "campaign.toml"
    text = path.read_text().replace('name = "demo"', 'name = "stored"', 1)
    path.write_text(text + f'\n[notify]\nwebhook_url = "{HOOK}"\n')
    return path


def _record(home: Path, spec: Path, *, recorded_spec: dict[str, object]) -> None:
    raw = tomllib.loads(spec.read_text())
    store = ProvenanceStore.open(home / "campaigns" / "stored")
    try:
        store.ensure_campaign(
            "stored", spec=recorded_spec, site="local", seed=raw["seed"], code_version="t"
        )
        store.set_campaign_status("stored", "completed", None)
    finally:
        store.close()


def test_a_record_made_before_urls_were_masked_is_still_the_same_campaign(
    spec: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("UNATTENDED_HOME", str(home))
    _record(home, spec, recorded_spec=tomllib.loads(spec.read_text()))  # URL in clear

    assert show_stored_completion(str(spec), None) is True
    out = capsys.readouterr().out
    assert "campaign stored already completed; showing the stored record" in out
    assert "s3cr3t" not in out


def test_a_record_with_another_webhook_is_another_campaign(
    spec: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from policies import SpecInvalid

    home = tmp_path / "home"
    monkeypatch.setenv("UNATTENDED_HOME", str(home))
    other = tomllib.loads(spec.read_text())
    other["notify"] = {"webhook_url": "https://elsewhere.example.net/hook/abc"}
    _record(home, spec, recorded_spec=other)

    with pytest.raises(SpecInvalid, match=r"recorded with another spec: notify\.webhook_url"):
        show_stored_completion(str(spec), None)
