"""Pinned inputs: what the spec names is hashed at first use; a change is refused or recorded."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from flows._engine._inputs import open_campaign
from flows._provenance import ProvenanceStore, SpecChanged
from flows._spec import load_campaign
from tasks import load_site

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo"


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    folder = tmp_path / "demo"
    shutil.copytree(DEMO, folder)
    return folder / "campaign.toml"


def _open(spec: Path, store: ProvenanceStore, *, accept: bool = False) -> int:
    loaded = load_campaign(spec)
    site = load_site(loaded.spec.site, env={})
    return open_campaign(store, loaded, site, code_version="test", accept_changes=accept)


class TestPins:
    def test_the_first_use_pins_every_named_input(self, demo: Path, tmp_path: Path) -> None:
        with ProvenanceStore.open(tmp_path / "state") as store:
            assert _open(demo, store) == 1
            revision, pins = store.pinned_inputs("demo")
        assert revision == 1
        assert set(pins) == {"spec", "policy", "transcript", "site", "simulation"}
        assert pins["policy"][0] == str(demo.parent / "policy.toml")

    def test_the_same_inputs_open_again(self, demo: Path, tmp_path: Path) -> None:
        with ProvenanceStore.open(tmp_path / "state") as store:
            _open(demo, store)
            assert _open(demo, store) == 1

    def test_an_edited_policy_is_refused_naming_the_file(self, demo: Path, tmp_path: Path) -> None:
        with ProvenanceStore.open(tmp_path / "state") as store:
            _open(demo, store)
            policy = demo.parent / "policy.toml"
            policy.write_text(policy.read_text() + "\n# edited\n")
            with pytest.raises(SpecChanged) as caught:
                _open(demo, store)
            assert caught.value.code == "spec_changed"
            assert caught.value.details["input"] == "policy"
            assert str(policy) in caught.value.message
            assert [e["kind"] for e in store.events("demo")] == ["inputs_pinned", "spec_changed"]
            assert store.pinned_inputs("demo")[0] == 1

    def test_an_edited_spec_is_refused_as_spec_changed(self, demo: Path, tmp_path: Path) -> None:
        with ProvenanceStore.open(tmp_path / "state") as store:
            _open(demo, store)
            demo.write_text(demo.read_text().replace("rounds = 4", "rounds = 5"))
            with pytest.raises(SpecChanged, match="spec"):
                _open(demo, store)

    def test_an_accepted_change_is_a_new_revision_with_who_and_hashes(
        self, demo: Path, tmp_path: Path
    ) -> None:
        with ProvenanceStore.open(tmp_path / "state") as store:
            _open(demo, store)
            old = store.pinned_inputs("demo")[1]["transcript"][1]
            transcript = demo.parent / "transcript.jsonl"
            transcript.write_text(transcript.read_text() + "\n")
            assert _open(demo, store, accept=True) == 2
            (event,) = store.events("demo", "inputs_revised")
            assert event["actor"]
            assert event["details"]["changed"]["transcript"]["old"] == old
            assert event["details"]["changed"]["transcript"]["new"] != old
            assert _open(demo, store) == 2
