"""One settings object for every variable unattended reads, loaded from a given environment."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from flows._settings import Settings
from policies import SpecInvalid

DOCS = Path(__file__).resolve().parents[2] / "docs" / "settings.md"
EPOCH = 1_800_000_000.0


class TestFromEnv:
    def test_reads_the_variables_of_the_mapping_it_is_given(self):
        settings = Settings.from_env(
            {"UNATTENDED_HOME": "/scratch/u", "UNATTENDED_SERVER_PORT": "4300"}
        )
        assert (settings.home, settings.server_port) == (Path("/scratch/u"), 4300)

    def test_never_reads_the_process_environment(self, monkeypatch):
        monkeypatch.setenv("UNATTENDED_HOME", "/from/the/process")
        assert Settings.from_env({}).home is None

    def test_the_state_directory_reads_the_variable_settings_home_reads(self, tmp_path):
        from flows._paths import HOME_VARIABLE, state_dir_from

        assert Settings.variables()["home"] == HOME_VARIABLE
        env = {HOME_VARIABLE: str(tmp_path / "u"), "HOME": str(tmp_path / "h")}
        assert state_dir_from(None, env) == Settings.from_env(env).home
        assert state_dir_from(None, {HOME_VARIABLE: "", "HOME": str(tmp_path / "h")}) == (
            tmp_path / "h" / ".unattended"
        )

    def test_an_empty_variable_counts_as_unset(self):
        assert Settings.from_env({"UNATTENDED_SERVER_PORT": ""}).server_port is None

    def test_a_bad_value_names_the_variable_and_field_but_not_the_value(self):
        with pytest.raises(
            SpecInvalid, match=r"server_port \(environment variable UNATTENDED_SERVER_PORT\)"
        ) as caught:
            Settings.from_env({"UNATTENDED_SERVER_PORT": "99999"})
        assert "99999" not in caught.value.message
        assert caught.value.code == "spec_invalid"


class TestAllocationWindow:
    def test_the_unattended_end_wins_over_slurms(self):
        settings = Settings.from_env(
            {"UNATTENDED_ALLOCATION_END": str(EPOCH), "SLURM_JOB_END_TIME": "1"}
        )
        assert settings.allocation_window().end == datetime.fromtimestamp(EPOCH, UTC)

    def test_without_an_end_the_start_plus_the_site_walltime_is_the_end(self):
        settings = Settings.from_env({"SLURM_JOB_START_TIME": str(EPOCH)})
        window = settings.allocation_window(walltime_seconds=3600.0)
        assert window.start == datetime.fromtimestamp(EPOCH, UTC)
        assert window.end == datetime.fromtimestamp(EPOCH + 3600, UTC)

    def test_the_remaining_time_counts_down_and_stops_at_zero(self):
        window = Settings.from_env({"UNATTENDED_ALLOCATION_END": str(EPOCH)}).allocation_window()
        assert window.remaining(datetime.fromtimestamp(EPOCH - 90, UTC)) == 90.0
        assert window.remaining(datetime.fromtimestamp(EPOCH + 90, UTC)) == 0.0


def test_the_settings_page_documents_every_variable_with_its_field():
    rows = re.findall(r"^\| `([A-Z_]+)` \| `([a-z_]+)` \|", DOCS.read_text(), flags=re.M)
    assert dict(rows) == {variable: field for field, variable in Settings.variables().items()}


def test_every_field_has_a_description():
    assert all(info.description for info in Settings.model_fields.values())
