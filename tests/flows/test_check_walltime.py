"""``check`` (hence ``submit`` and ``run``) refuses a task longer than the site's allocation.

A task's duration is the site's cost model, as the walltime-aware launcher reads
it (``cost.simulation_seconds``, else ``node_hours_per_simulation`` x 3600; the
verifier's likewise). Before, such a campaign was accepted and stopped
``deadline_exceeded`` on the runner, after its allocation had been asked for.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from flows._check import check_campaign, require_valid
from flows._cli import main
from policies import SiteInvalid

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "demo"
SLURM_LOCAL = ROOT / "site-configs" / "slurm-local.toml"  # walltime "00:10:00", 600 s
COST = """[cost]
node_hours_per_simulation = 0.001
node_hours_per_verifier = 0.0001"""


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    """A copy of the demo campaign (spec, policies, transcript) in ``tmp_path``."""
    for item in EXAMPLES.iterdir():
        shutil.copy(item, tmp_path / item.name)
    return tmp_path


def slurm_site(folder: Path, cost: str, old: str = "", new: str = "") -> Path:
    """Write slurm-local.toml with ``cost`` as its [cost] table (and ``old`` -> ``new``)."""
    text = SLURM_LOCAL.read_text()
    assert COST in text
    text = text.replace(COST, cost)
    if old:
        assert old in text, old
        text = text.replace(old, new)
    site = folder / "site.toml"
    site.write_text(text)
    return site


def fields(spec: Path, site: Path) -> list[str | None]:
    return [p.field for p in check_campaign(spec, str(site), env={}).problems]


class TestTaskLongerThanWalltime:
    def test_a_simulation_longer_than_the_walltime_is_refused_naming_file_and_fields(
        self, demo: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        site = slurm_site(
            demo, "[cost]\nnode_hours_per_simulation = 0.001\nsimulation_seconds = 900.0"
        )
        assert main(["check", str(demo / "campaign.toml"), "--site", str(site)]) == 2
        lines = capsys.readouterr().err.splitlines()
        assert lines == [
            f"error: {site}: field 'cost.simulation_seconds': one simulation task takes 900 s by "
            "the site's cost model (cost.simulation_seconds), longer than the allocation's "
            'walltime scheduler.walltime = "00:10:00" (600 s): no allocation could finish it; '
            "raise scheduler.walltime or set cost.simulation_seconds to what one simulation "
            "task really takes",
            "1 problem found",
        ]

    def test_without_simulation_seconds_the_node_hours_are_named(self, demo: Path) -> None:
        site = slurm_site(demo, "[cost]\nnode_hours_per_simulation = 0.5")
        report = check_campaign(demo / "campaign.toml", str(site), env={})
        (problem,) = report.problems
        assert problem.field == "cost.node_hours_per_simulation"
        assert "takes 1800 s" in problem.text
        assert "(cost.node_hours_per_simulation x 3600, as cost.simulation_seconds" in problem.text

    def test_a_task_as_long_as_the_walltime_fits(self, demo: Path) -> None:
        site = slurm_site(
            demo, "[cost]\nnode_hours_per_simulation = 0.001\nsimulation_seconds = 600.0"
        )
        assert fields(demo / "campaign.toml", site) == []

    def test_a_verifier_longer_than_the_walltime_is_refused_when_the_spec_has_one(
        self, demo: Path
    ) -> None:
        site = slurm_site(
            demo, "[cost]\nnode_hours_per_simulation = 0.001\nverifier_seconds = 601.0"
        )
        spec = demo / "campaign.toml"
        assert fields(spec, site) == ["cost.verifier_seconds"]
        text = spec.read_text()
        spec.write_text(text.replace("verifier_limit = 25.0", "# no verifier"))
        assert fields(spec, site) == []

    def test_a_site_without_a_walltime_has_no_such_limit(self, demo: Path) -> None:
        site = slurm_site(
            demo,
            "[cost]\nnode_hours_per_simulation = 0.001\nsimulation_seconds = 86400.0",
            'walltime = "00:10:00"',
            "",
        )
        assert fields(demo / "campaign.toml", site) == []

    def test_a_pilot_shorter_than_the_scheduler_walltime_is_the_limit(self, demo: Path) -> None:
        site = demo / "radical.toml"
        text = (ROOT / "site-configs" / "slurm-radical.toml").read_text()
        text = text.replace("runtime_minutes = 240", "runtime_minutes = 20")
        site.write_text(
            text.replace('"<YOUR_ALLOCATION>"', '"a"').replace('"<YOUR_PARTITION>"', '"p"')
        )
        report = check_campaign(demo / "campaign.toml", str(site), env={})
        (walltime,) = [p for p in report.problems if p.field == "cost.node_hours_per_simulation"]
        assert "walltime backend.runtime_minutes = 20 (1200 s)" in walltime.text

    def test_submit_and_run_refuse_it_as_a_site_problem(self, demo: Path) -> None:
        """``require_valid`` is what submit and run call before anything else."""
        site = slurm_site(
            demo, "[cost]\nnode_hours_per_simulation = 0.001\nsimulation_seconds = 900.0"
        )
        with pytest.raises(SiteInvalid) as caught:
            require_valid(demo / "campaign.toml", str(site), env={})
        assert caught.value.details["field"] == "cost.simulation_seconds"
        assert caught.value.details["file"] == str(site)

    @pytest.mark.parametrize("name", ["slurm-local", "slurm", "dask-cluster", "slurm-radical"])
    def test_the_shipped_sites_tasks_fit_their_walltime(self, name: str) -> None:
        report = check_campaign(EXAMPLES / "campaign.toml", name, env={})
        assert not [p for p in report.problems if (p.field or "").startswith("cost.")]
