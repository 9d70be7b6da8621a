"""Extending a campaign: more rounds or a larger budget is a recorded revision; nothing else is.

The end-to-end test runs through the real Prefect server, the real runner and the
real provenance: a finished campaign extended by two rounds runs exactly two more.
The refusals go through the CLI (``check`` and ``submit`` say the same thing).
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from flows._cli import main
from flows._engine._extension import raised_text
from flows._engine._inputs import open_campaign
from flows._provenance import ProvenanceStore, SpecChanged
from flows._spec import load_campaign
from policies import SpecInvalid
from tasks import load_site

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "demo"


def _demo(folder: Path, name: str, **replace: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for item in EXAMPLES.iterdir():
        shutil.copy(item, folder / item.name)
    spec = folder / "campaign.toml"
    text = spec.read_text().replace('name = "demo"', f'name = "{name}"')
    for old, new in replace.items():
        text = text.replace(old, new)
    spec.write_text(text)
    return spec


def _edit(spec: Path, old: str, new: str) -> None:
    text = spec.read_text()
    assert old in text
    spec.write_text(text.replace(old, new))


def _open(spec: Path, store: ProvenanceStore, *, extend: bool) -> int:
    loaded = load_campaign(spec)
    site = load_site(loaded.spec.site, env={})
    return open_campaign(store, loaded, site, code_version="test", extend=extend)


class TestTheRecord:
    def test_raising_rounds_and_budget_is_a_revision_with_who_and_old_and_new(
        self, tmp_path: Path
    ) -> None:
        spec = _demo(tmp_path / "c", "grows")
        with ProvenanceStore.open(tmp_path / "state") as store:
            assert _open(spec, store, extend=True) == 1
            _edit(spec, "rounds = 4", "rounds = 6")
            _edit(spec, "budget_node_hours = 64.0", "budget_node_hours = 96.0")
            assert _open(spec, store, extend=True) == 2
            (event,) = store.events("grows", "campaign_extended")
            recorded = store.summary("grows")["campaign"]["spec"]
        assert event["actor"]
        assert event["details"] == {
            "revision": 2,
            "fields": {
                "budget_node_hours": {"old": 64.0, "new": 96.0},
                "rounds": {"old": 4, "new": 6},
            },
        }
        assert recorded["rounds"] == 6

    def test_a_flow_run_never_extends_it_says_to_submit(self, tmp_path: Path) -> None:
        spec = _demo(tmp_path / "c", "unsubmitted")
        with ProvenanceStore.open(tmp_path / "state") as store:
            _open(spec, store, extend=True)
            _edit(spec, "rounds = 4", "rounds = 5")
            with pytest.raises(SpecChanged) as caught:
                _open(spec, store, extend=False)
            assert store.events("unsubmitted", "campaign_extended") == []
        assert "was extended in the file (rounds 4 -> 5) but not submitted" in str(caught.value)

    def test_every_other_change_is_refused_naming_each_field(self, tmp_path: Path) -> None:
        spec = _demo(tmp_path / "c", "other")
        with ProvenanceStore.open(tmp_path / "state") as store:
            _open(spec, store, extend=True)
            _edit(spec, "seed = 7", "seed = 8")
            _edit(spec, "upper = [1.0, 1.0]", "upper = [2.0, 1.0]")
            _edit(spec, "rounds = 4", "rounds = 3")
            with pytest.raises(SpecChanged) as caught:
                _open(spec, store, extend=True)
        message = str(caught.value)
        assert caught.value.details["fields"] == ["objective.upper", "rounds", "seed"]
        assert "objective.upper ([1.0, 1.0] -> [2.0, 1.0]), rounds (4 -> 3), seed (7 -> 8)" in (
            message
        )
        assert "(rounds can only grow)" in message


class TestTheSpecText:
    def test_only_the_values_change_comments_kept(self) -> None:
        text = "name = 'x'\nrounds = 4   # how many\nbudget_node_hours = 8.0\n[objective]\n"
        assert raised_text(text, {"rounds": 6, "budget_node_hours": 9.5}) == (
            "name = 'x'\nrounds = 6   # how many\nbudget_node_hours = 9.5\n[objective]\n"
        )

    def test_a_field_not_written_on_its_own_line_names_the_field(self) -> None:
        with pytest.raises(SpecInvalid) as caught:
            raised_text("name = 'x'\n[objective]\nrounds = 4\n", {"rounds": 6})
        assert caught.value.details["field"] == "rounds"


class TestCheckSaysWhatSubmitSays:
    def test_a_changed_seed_is_refused_by_both_naming_seed(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        home = tmp_path / "home"
        monkeypatch.setenv("UNATTENDED_HOME", str(home))
        spec = _demo(tmp_path / "c", "seeded")
        with ProvenanceStore.open(home / "campaigns" / "seeded") as store:
            _open(spec, store, extend=True)
        _edit(spec, "seed = 7", "seed = 8")
        said = []
        for command in ("check", "submit"):
            assert main([command, str(spec)]) == 2
            said.append(capsys.readouterr().err)
        assert said[0].splitlines()[0] == said[1].splitlines()[0]
        assert (
            "field 'seed': campaign 'seeded' is recorded with another spec: seed (7 -> 8)"
            in said[1]
        )

    def test_an_extension_checks_out_and_says_so(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        home = tmp_path / "home"
        monkeypatch.setenv("UNATTENDED_HOME", str(home))
        spec = _demo(tmp_path / "c", "longer")
        with ProvenanceStore.open(home / "campaigns" / "longer") as store:
            _open(spec, store, extend=True)
        _edit(spec, "rounds = 4", "rounds = 6")
        assert main(["check", str(spec)]) == 0
        assert "extends the recorded campaign: rounds 4 -> 6" in capsys.readouterr().out


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_extending_a_finished_campaign_by_two_rounds_runs_exactly_two_more(
    prefect_server: object,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from flows._prefect._deployment import submit_campaign
    from flows._prefect._service import CampaignService, read_run

    home = tmp_path / "home"
    monkeypatch.setenv("UNATTENDED_HOME", str(home))
    spec = _demo(tmp_path / "c", "e2e-extend", **{"rounds = 4": "rounds = 2"})
    first = asyncio.run(submit_campaign(spec, state_dir=home))
    service = CampaignService(query_seconds=0.5, state_dir=home)
    asyncio.run(service.run_once())
    assert asyncio.run(read_run(first.flow_run_id)).state.type.value == "COMPLETED"
    with ProvenanceStore.open(home / "campaigns" / "e2e-extend") as store:
        before = store.summary("e2e-extend")["rounds"]
    assert [r["index"] for r in before] == [0, 1]

    assert main(["extend", "e2e-extend", "--rounds", "4"]) == 0
    out = capsys.readouterr().out
    assert "campaign e2e-extend extended: rounds 2 -> 4" in out
    assert "rounds = 4" in spec.read_text()
    asyncio.run(service.run_once())

    with ProvenanceStore.open(home / "campaigns" / "e2e-extend") as store:
        summary = store.summary("e2e-extend")
        (event,) = store.events("e2e-extend", "campaign_extended")
        revision = store.pinned_inputs("e2e-extend")[0]
    after = summary["rounds"]
    assert summary["campaign"]["status"] == "completed"
    assert [r["index"] for r in after] == [0, 1, 2, 3]
    # Rounds 0 and 1 were not run again: the same rows, finished when they were.
    assert [(r["started_at"], r["finished_at"], r["tasks"]) for r in after[:2]] == [
        (r["started_at"], r["finished_at"], r["tasks"]) for r in before
    ]
    assert all(r["status"] == "completed" and r["tasks"] > 0 for r in after[2:])
    assert event["details"] == {"revision": 2, "fields": {"rounds": {"old": 2, "new": 4}}}
    assert revision == 2
