"""Site configs: every shipped file loads; every bad file fails naming the file and field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tomli_w

from policies import SiteInvalid
from tasks import SiteConfig, load_site
from tasks._site_backends import DaskBackend, LocalBackend, RadicalPilotBackend

SHIPPED = sorted((Path(__file__).resolve().parents[2] / "site-configs").glob("*.toml"))
SECRET = "sk-test-do-not-echo-0123456789"

MINIMAL: dict[str, Any] = {
    "name": "mini",
    "backend": {"kind": "local"},
    "cost": {"node_hours_per_simulation": 0.5},
}


def write(tmp_path: Path, data: dict[str, Any], name: str = "site.toml") -> Path:
    path = tmp_path / name
    path.write_text(tomli_w.dumps(data), encoding="utf-8")
    return path


def merged(**changes: Any) -> dict[str, Any]:
    data = {
        key: (dict(value) if isinstance(value, dict) else value) for key, value in MINIMAL.items()
    }
    for dotted, value in changes.items():
        target = data
        parts = dotted.split("__")
        for part in parts[:-1]:
            target = target.setdefault(part, {})
        if value is _DELETE:
            target.pop(parts[-1], None)
        else:
            target[parts[-1]] = value
    return data


_DELETE = object()


class TestShippedSites:
    def test_the_project_ships_the_example_sites(self) -> None:
        names = {path.stem for path in SHIPPED}
        assert {"local", "dask-cluster", "slurm", "slurm-local", "radical-pilot"} <= names

    @pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
    def test_every_shipped_site_loads(self, path: Path) -> None:
        site = load_site(path, env={})
        assert site.name == path.stem
        assert site.source == str(path)

    def test_local_is_a_process_pool_on_this_machine(self) -> None:
        site = load_site("local", env={})
        assert isinstance(site.backend, LocalBackend)
        assert site.backend.executor == "process"
        assert site.listen == "127.0.0.1"
        assert site.placeholders() == []

    def test_examples_mark_what_the_user_must_fill_in(self) -> None:
        site = load_site("dask-cluster", env={})
        assert isinstance(site.backend, DaskBackend)
        assert "scheduler.account" in site.placeholders()
        assert "backend.scheduler_address" in site.placeholders()

    def test_slurm_uses_jobqueue_and_marks_the_account_and_partition(self) -> None:
        site = load_site("slurm", env={})
        assert isinstance(site.backend, DaskBackend)
        assert site.backend.jobqueue is not None
        assert site.backend.jobqueue.system == "slurm"
        assert {"scheduler.account", "scheduler.queue"} <= set(site.placeholders())
        assert site.scheduler.max_allocations is not None
        assert site.scheduler.prologue

    def test_slurm_local_runs_as_it_is(self) -> None:
        site = load_site("slurm-local", env={})
        assert isinstance(site.backend, DaskBackend)
        assert site.backend.jobqueue is not None
        assert site.placeholders() == []
        assert site.scheduler.system == "slurm"
        assert site.scheduler.walltime_seconds is not None

    def test_radical_pilot_has_resource_cores_and_runtime(self) -> None:
        site = load_site("radical-pilot", env={})
        assert isinstance(site.backend, RadicalPilotBackend)
        assert site.backend.cores >= 1
        assert site.backend.runtime_minutes >= 1


class TestLoadSite:
    def test_a_name_is_found_in_a_site_configs_folder_of_the_cwd(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        (tmp_path / "site-configs").mkdir()
        write(tmp_path / "site-configs", MINIMAL | {"name": "here"}, "here.toml")
        monkeypatch.chdir(tmp_path)
        assert load_site("here", env={}).name == "here"

    def test_the_name_defaults_to_the_file_stem(self, tmp_path: Path) -> None:
        data = dict(MINIMAL)
        del data["name"]
        assert load_site(write(tmp_path, data, "frontera.toml"), env={}).name == "frontera"

    def test_an_unknown_site_name_is_site_invalid(self) -> None:
        with pytest.raises(SiteInvalid, match="no-such-site") as caught:
            load_site("no-such-site", env={})
        assert caught.value.details["field"] == "site"

    def test_env_references_are_expanded_from_the_given_mapping(self, tmp_path: Path) -> None:
        data = merged(secrets={"model_api_key": "${MODEL_KEY}"}, prefect_api_url="${PREFECT}")
        site = load_site(
            write(tmp_path, data), env={"MODEL_KEY": SECRET, "PREFECT": "http://127.0.0.1:4200/api"}
        )
        assert site.secrets["model_api_key"].get_secret_value() == SECRET
        assert site.prefect_api_url == "http://127.0.0.1:4200/api"

    def test_a_secret_never_appears_in_repr_or_dump(self, tmp_path: Path) -> None:
        site = load_site(write(tmp_path, merged(secrets={"key": "${K}"})), env={"K": SECRET})
        assert SECRET not in repr(site)
        assert SECRET not in site.model_dump_json()

    def test_a_missing_env_variable_names_the_field_and_the_variable(self, tmp_path: Path) -> None:
        path = write(tmp_path, merged(secrets={"model_api_key": "${NOT_SET_ANYWHERE}"}))
        with pytest.raises(SiteInvalid) as caught:
            load_site(path, env={})
        assert caught.value.details == {
            "file": str(path),
            "field": "secrets.model_api_key",
            "expected": "${NOT_SET_ANYWHERE} set",
        }

    def test_a_bad_secret_value_is_not_echoed(self, tmp_path: Path) -> None:
        path = write(tmp_path, merged(secrets={"key": "${K}"}, listen="${K}"))
        with pytest.raises(SiteInvalid) as caught:
            load_site(path, env={"K": SECRET})
        assert SECRET not in str(caught.value)
        assert SECRET not in repr(caught.value.to_dict())

    def test_walltime_is_converted_to_seconds(self) -> None:
        site = SiteConfig.model_validate(merged(scheduler={"walltime": "1-02:03:04"}))
        assert site.scheduler.walltime_seconds == 93784.0

    def test_partition_is_the_slurm_name_of_the_queue(self) -> None:
        site = SiteConfig.model_validate(merged(scheduler={"partition": "debug"}))
        assert site.scheduler.queue == "debug"

    def test_pbs_and_pjm_scheduler_fields_are_validated(self) -> None:
        for system in ("pbs", "pjm"):
            site = SiteConfig.model_validate(
                merged(scheduler={"system": system, "queue": "q", "walltime": "01:00:00"})
            )
            assert site.scheduler.system == system

    def test_a_site_without_walltime_has_none(self) -> None:
        site = SiteConfig.model_validate(MINIMAL)
        assert site.scheduler.walltime_seconds is None


BAD_CASES: list[tuple[str, dict[str, Any] | str, str]] = [
    ("not-toml", "name = [unclosed", ""),
    ("unknown-top-level-field", merged(colour="blue"), "colour"),
    ("missing-backend", merged(backend=_DELETE), "backend"),
    ("missing-cost", merged(cost=_DELETE), "cost"),
    ("unknown-backend-kind", merged(backend={"kind": "slurm"}), "backend.kind"),
    ("backend-without-kind", merged(backend={"executor": "thread"}), "backend.kind"),
    (
        "bad-local-executor",
        merged(backend={"kind": "local", "executor": "gpu"}),
        "backend.executor",
    ),
    (
        "zero-max-workers",
        merged(backend={"kind": "local", "max_workers": 0}),
        "backend.max_workers",
    ),
    ("unknown-local-field", merged(backend={"kind": "local", "threads": 4}), "backend.threads"),
    ("dask-without-source", merged(backend={"kind": "dask"}), "backend"),
    (
        "dask-with-two-sources",
        merged(backend={"kind": "dask", "cluster": "local", "scheduler_address": "tcp://h:8786"}),
        "backend",
    ),
    (
        "dask-bad-address",
        merged(backend={"kind": "dask", "scheduler_address": "http://h:8786"}),
        "backend.scheduler_address",
    ),
    (
        "jobqueue-bad-memory",
        merged(
            backend={"kind": "dask", "jobqueue": {"system": "slurm", "cores": 4, "memory": "lots"}}
        ),
        "backend.jobqueue.memory",
    ),
    (
        "radical-pilot-without-cores",
        merged(
            backend={"kind": "radical_pilot", "resource": "local.localhost", "runtime_minutes": 5}
        ),
        "backend.cores",
    ),
    ("zero-concurrency", merged(max_concurrency=0), "max_concurrency"),
    ("negative-timeout", merged(task_timeout=-1.0), "task_timeout"),
    ("too-many-retries", merged(retries=100), "retries"),
    ("retries-not-a-number", merged(retries="three"), "retries"),
    ("bad-walltime", merged(scheduler={"walltime": "2 hours"}), "scheduler.walltime"),
    ("bad-scheduler-system", merged(scheduler={"system": "condor"}), "scheduler.system"),
    (
        "zero-node-hours",
        merged(cost={"node_hours_per_simulation": 0.0}),
        "cost.node_hours_per_simulation",
    ),
    (
        "negative-verifier-cost",
        merged(cost={"node_hours_per_simulation": 1.0, "node_hours_per_verifier": -1.0}),
        "cost.node_hours_per_verifier",
    ),
    ("listen-not-an-address", merged(listen="my laptop"), "listen"),
    ("prefect-url-not-http", merged(prefect_api_url="ftp://x"), "prefect_api_url"),
    ("otlp-not-http", merged(otlp_endpoint="collector:4318"), "otlp_endpoint"),
    ("bad-name", merged(name="has spaces"), "name"),
    ("bad-secret-name", merged(secrets={"Bad-Name": "x"}), "secrets"),
    ("kill-grace-too-long", merged(kill_grace=1e6), "kill_grace"),
    (
        "prologue-line-with-newline",
        merged(scheduler={"prologue": ["module load a\nmodule load b"]}),
        "scheduler.prologue",
    ),
    (
        "prologue-with-sbatch-line",
        merged(scheduler={"prologue": ["#SBATCH --exclusive"]}),
        "scheduler.prologue",
    ),
    ("zero-allocations", merged(scheduler={"max_allocations": 0}), "scheduler.max_allocations"),
    ("zero-node-hour-budget", merged(scheduler={"max_node_hours": 0}), "scheduler.max_node_hours"),
    ("poll-too-often", merged(scheduler={"poll_seconds": 0.0}), "scheduler.poll_seconds"),
    ("unknown-scheduler-field", merged(scheduler={"nodes": 4}), "scheduler.nodes"),
    (
        "jobqueue-and-scheduler-disagree",
        merged(
            backend={"kind": "dask", "jobqueue": {"system": "pbs", "cores": 4, "memory": "8GB"}},
            scheduler={"system": "slurm"},
        ),
        "scheduler",
    ),
]


class TestBadSites:
    @pytest.mark.parametrize(
        ("content", "field"), [c[1:] for c in BAD_CASES], ids=[c[0] for c in BAD_CASES]
    )
    def test_a_bad_site_names_the_file_and_the_field(
        self, tmp_path: Path, content: dict[str, Any] | str, field: str
    ) -> None:
        path = tmp_path / "bad.toml"
        if isinstance(content, str):
            path.write_text(content, encoding="utf-8")
        else:
            write(tmp_path, content, "bad.toml")
        with pytest.raises(SiteInvalid) as caught:
            load_site(path, env={})
        error = caught.value
        assert error.code == "site_invalid"
        assert error.details["file"] == str(path)
        assert str(path) in error.message
        if field:
            assert error.details["field"] == field
            assert f"field {field}" in error.message
            assert error.details["expected"]

    def test_a_missing_file_is_site_invalid(self, tmp_path: Path) -> None:
        with pytest.raises(SiteInvalid, match="not found"):
            load_site(tmp_path / "absent.toml", env={})
