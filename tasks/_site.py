"""Site configs: one commented TOML file per site, validated by ``SiteConfig``.

``load_site("local")`` reads ``site-configs/local.toml``; a path works too.
``${VAR}`` in any string is expanded from the ``env`` mapping given to the loader
(the process environment when none is given), so secrets stay out of the file.
A bad file raises ``SiteInvalid`` naming the file and the dotted field; values,
and above all secrets, never appear in the message.
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from policies import SiteInvalid
from tasks._site_backends import (
    PLACEHOLDER,
    Backend,
    DaskBackend,
    JobqueueConfig,
    LocalBackend,
    RadicalPilotBackend,
)
from tasks._site_notify import HTTP_URL, NotifyConfig

_STRICT = ConfigDict(extra="forbid", frozen=True)
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_WALLTIME = re.compile(r"^(?:(\d+)-)?(\d{1,3}):([0-5]\d):([0-5]\d)$")

#: Folders searched for ``<name>.toml``, relative to the CWD and to the project.
DEFAULT_SEARCH: tuple[str, ...] = ("site-configs",)
_PROJECT_ROOT = Path(__file__).resolve().parent.parent


class SchedulerConfig(BaseModel):
    """The batch system the campaign's allocations come from, and what they may cost.

    Slurm is run for real (dask-jobqueue and RADICAL-Pilot backends submit jobs
    with these fields); PBS and PJM fields are validated only.
    """

    model_config = _STRICT

    system: Literal["none", "slurm", "pbs", "pjm"] = Field(
        default="none",
        description="Batch system: none, slurm, pbs or pjm (the last two are validated only).",
    )
    account: str | None = Field(default=None, max_length=128, description="Allocation to charge.")
    queue: str | None = Field(
        default=None,
        max_length=128,
        validation_alias=AliasChoices("queue", "partition"),
        description="Partition (Slurm) or queue (PBS, PJM resource group); 'partition' works too.",
    )
    qos: str | None = Field(default=None, max_length=128, description="Quality of service.")
    walltime: str | None = Field(default=None, description="Allocation walltime as [D-]HH:MM:SS.")
    prologue: list[str] = Field(
        default_factory=list,
        max_length=256,
        description=(
            "Lines at the top of every job script, before the workers start "
            "('module load ...', 'source .../activate', 'export OMP_NUM_THREADS=1')."
        ),
    )
    log_directory: str | None = Field(
        default=None,
        max_length=4096,
        description="Where job output goes; relative: under the campaign directory (slurm-logs).",
    )
    max_allocations: int | None = Field(
        default=None, ge=1, le=100_000, description="Allocations a campaign may request in all."
    )
    max_node_hours: float | None = Field(
        default=None, gt=0.0, le=1e9, description="Node-hours the allocations may use in all."
    )
    poll_seconds: float = Field(
        default=10.0, ge=0.1, le=3600.0, description="How often squeue is asked about the jobs."
    )
    unreachable_seconds: float = Field(
        default=300.0,
        ge=0.0,
        le=86_400.0,
        description=(
            "How long the batch system may not answer (slurmctld restarting or failing "
            "over; Slurm's own SlurmctldTimeout is 120 s) before its jobs count as ended "
            "'unknown'. Meanwhile nothing is killed and no allocation is requested."
        ),
    )

    @field_validator("prologue")
    @classmethod
    def _prologue(cls, value: list[str]) -> list[str]:
        for line in value:
            if "\n" in line or "\r" in line:
                raise ValueError("one shell line per entry (no newlines)")
            if line.lstrip().startswith("#SBATCH"):
                raise ValueError("'#SBATCH' lines go in backend.jobqueue.job_extra_directives")
        return value

    @field_validator("walltime")
    @classmethod
    def _walltime(cls, value: str | None) -> str | None:
        if value is not None and not _WALLTIME.match(value):
            raise ValueError("expected a walltime like '02:00:00' or '1-12:00:00'")
        return value

    @property
    def walltime_seconds(self) -> float | None:
        """Return the walltime in seconds, or None when there is none."""
        if self.walltime is None:
            return None
        match = _WALLTIME.match(self.walltime)
        assert match is not None  # validated above
        days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
        return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


class CostConfig(BaseModel):
    """What a task costs: node-hours for budget policies, seconds for walltime-aware launches."""

    model_config = _STRICT

    node_hours_per_simulation: float = Field(
        gt=0.0, le=1e6, description="Node-hours one simulation task costs."
    )
    node_hours_per_verifier: float = Field(
        default=0.0, ge=0.0, le=1e6, description="Node-hours one verifier task costs."
    )
    simulation_seconds: float | None = Field(
        default=None,
        gt=0.0,
        le=30 * 86_400.0,
        description="Wall-clock seconds of one simulation task (default: its node-hours x 3600).",
    )
    verifier_seconds: float | None = Field(
        default=None,
        ge=0.0,
        le=30 * 86_400.0,
        description="Wall-clock seconds of one verifier task (default: its node-hours x 3600).",
    )


class SiteConfig(BaseModel):
    """Where and how a campaign's work runs."""

    model_config = _STRICT

    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="Site name (defaults to file stem).",
    )
    backend: Backend = Field(description="Execution backend, chosen by backend.kind.")
    max_concurrency: int = Field(
        default=64, ge=1, le=100_000, description="Tasks in flight at once (executables too)."
    )
    task_timeout: float | None = Field(
        default=None, gt=0.0, le=30 * 86_400.0, description="Default per-attempt timeout, seconds."
    )
    retries: int = Field(
        default=2, ge=0, le=10, description="Retries of a task whose failure is transient."
    )
    retry_backoff: float = Field(
        default=1.0, ge=0.0, le=600.0, description="Seconds before the first retry (doubles)."
    )
    transient_exit_codes: list[int] = Field(
        default_factory=list, max_length=64, description="Exit codes that mean 'try again'."
    )
    kill_grace: float = Field(
        default=5.0, ge=0.0, le=300.0, description="Seconds between SIGTERM and SIGKILL."
    )
    scheduler: SchedulerConfig = Field(
        default_factory=SchedulerConfig, description="The batch allocation, if any."
    )
    provenance_url: SecretStr | None = Field(
        default=None, description="SQLAlchemy URL; default: SQLite in the campaign directory."
    )
    prefect_api_url: str | None = Field(default=None, description="Prefect API URL.")
    otlp_endpoint: str | None = Field(default=None, description="OTLP/HTTP endpoint for telemetry.")
    cost: CostConfig = Field(description="Node-hours per task, for budget policies.")
    listen: str = Field(
        default="127.0.0.1", description="Host that servers started for the site bind to."
    )
    secrets: dict[str, SecretStr] = Field(
        default_factory=dict, description="Named secrets, usually '${ENV_VAR}' references."
    )
    notify: NotifyConfig | None = Field(
        default=None,
        description="Notifications for this site's campaigns (Apprise URLs, webhook, email).",
    )

    _source: str | None = PrivateAttr(default=None)

    @field_validator("scheduler")
    @classmethod
    def _one_batch_system(cls, value: SchedulerConfig, info: ValidationInfo) -> SchedulerConfig:
        # `backend` is declared (so validated) before `scheduler`.
        jobqueue = getattr(info.data.get("backend"), "jobqueue", None)
        if jobqueue is not None and value.system not in ("none", jobqueue.system):
            raise ValueError(
                "backend.jobqueue.system and scheduler.system name different batch systems"
            )
        return value

    @field_validator("prefect_api_url", "otlp_endpoint")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not HTTP_URL.match(value):
            raise ValueError("expected an http(s):// URL")
        return value

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        if value == "localhost":
            return value
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ValueError("expected an IP address such as '127.0.0.1'") from None
        return value

    @field_validator("secrets")
    @classmethod
    def _secret_names(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for name in value:
            if not re.match(r"^[a-z][a-z0-9_]{0,63}$", name):
                raise ValueError("secret names are lower_snake_case identifiers")
        return value

    def allocation_limit(self) -> tuple[str, float, str] | None:
        """Return the shortest allocation the site's work runs in: (field, seconds, as written).

        ``scheduler.walltime`` and, for a RADICAL-Pilot pilot, its ``runtime_minutes``
        (the pilot ends then whatever the job's walltime): the launcher
        (``AllocationExecutor.ensure_time``) and ``unattended check`` read this one limit.
        """
        limits: list[tuple[str, float, str]] = []
        walltime = self.scheduler.walltime_seconds
        if walltime is not None:
            limits.append(("scheduler.walltime", walltime, f'"{self.scheduler.walltime}"'))
        if isinstance(self.backend, RadicalPilotBackend):
            runtime = self.backend.runtime_minutes
            limits.append(("backend.runtime_minutes", runtime * 60.0, str(runtime)))
        return min(limits, key=lambda limit: limit[1]) if limits else None

    def worker_slots(self) -> int:
        """Return how many tasks the site's workers run at once (for time estimates)."""
        match self.backend:
            case DaskBackend(jobqueue=JobqueueConfig() as jobqueue):
                slots = jobqueue.jobs * jobqueue.cores
            case DaskBackend(cluster="local") as dask:
                slots = dask.n_workers * dask.threads_per_worker
            case LocalBackend() as local:
                slots = local.max_workers or os.cpu_count() or 1
            case RadicalPilotBackend() as pilot:
                slots = pilot.cores
            case _:
                slots = self.max_concurrency
        return max(1, min(slots, self.max_concurrency))

    def batch_seconds(self, simulations: int, verifiers: int = 0) -> float:
        """Return how long ``simulations`` (and ``verifiers``) tasks take on the site's workers.

        Tasks run ``worker_slots()`` at a time; one takes ``cost.simulation_seconds``
        (or ``node_hours_per_simulation`` x 3600), a verifier likewise.
        """
        cost = self.cost
        simulation = cost.simulation_seconds or cost.node_hours_per_simulation * 3600.0
        verifier = (
            cost.verifier_seconds
            if cost.verifier_seconds is not None
            else cost.node_hours_per_verifier * 3600.0
        )
        slots = self.worker_slots()
        waves = -(-simulations // slots), -(-verifiers // slots)
        return waves[0] * simulation + waves[1] * verifier

    @property
    def source(self) -> str | None:
        """Return the file this config was loaded from, if any."""
        return self._source

    def placeholders(self) -> list[str]:
        """Return the dotted fields still holding a ``<PLACEHOLDER>`` value."""
        found: list[str] = []

        def walk(value: Any, path: str) -> None:
            if isinstance(value, dict):
                for key, item in value.items():
                    walk(item, f"{path}.{key}" if path else str(key))
            elif isinstance(value, list):
                for i, item in enumerate(value):
                    walk(item, f"{path}.{i}")
            elif isinstance(value, str) and PLACEHOLDER.match(value):
                found.append(path)

        walk(self.model_dump(exclude={"secrets", "provenance_url"}), "")
        return found


def _expand(value: Any, env: Mapping[str, str], path: str, file: str) -> Any:
    """Expand ``${VAR}`` in every string of ``value``; a missing variable is an error."""
    if isinstance(value, dict):
        return {k: _expand(v, env, f"{path}.{k}" if path else k, file) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, env, f"{path}.{i}", file) for i, v in enumerate(value)]
    if isinstance(value, str) and "${" in value:

        def replace(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in env:
                raise SiteInvalid(
                    f"{file}: field {path}: environment variable {name} is not set",
                    details={"file": file, "field": path, "expected": f"${{{name}}} set"},
                )
            return env[name]

        return _ENV_REF.sub(replace, value)
    return value


def find_site_file(name_or_path: str | os.PathLike[str], search: Sequence[str]) -> Path:
    """Resolve a site name (``local``) or a path to an existing TOML file."""
    text = os.fspath(name_or_path)
    candidate = Path(text)
    if candidate.suffix == ".toml" or os.sep in text or "/" in text:
        if candidate.is_file():
            return candidate
        # Name what is there instead: a directory or a device is not "not found".
        what = (
            "is a directory, not a site config file"
            if candidate.is_dir()
            else "is not a regular file"
            if candidate.exists()
            else "site config file not found"
        )
        raise SiteInvalid(
            f"{text}: {what}",
            details={"file": text, "field": None, "expected": "an existing TOML file"},
        )
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", text):
        raise SiteInvalid(
            "site name must be letters, digits, '_', '-' or '.'",
            details={"file": None, "field": "site", "expected": "a site name or a path"},
        )
    looked: list[str] = []
    for folder in search:
        bases = (
            [Path(folder)]
            if Path(folder).is_absolute()
            else [Path.cwd() / folder, _PROJECT_ROOT / folder]
        )
        for base in bases:
            path = base / f"{text}.toml"
            looked.append(str(base))
            if path.is_file():
                return path
    raise SiteInvalid(
        f"site {text!r} not found; looked in {', '.join(dict.fromkeys(looked))}",
        details={
            "file": None,
            "field": "site",
            "expected": f"{text}.toml in a site-configs folder",
        },
    )


def load_site(
    name_or_path: str | os.PathLike[str],
    *,
    env: Mapping[str, str] | None = None,
    search: Sequence[str] = DEFAULT_SEARCH,
) -> SiteConfig:
    """Load and validate a site config by name or path.

    Args:
        name_or_path: ``"local"`` (found as ``site-configs/local.toml`` next to the
            CWD or the project) or a path to a ``.toml`` file.
        env: Variables for ``${VAR}`` expansion; ``None`` means ``os.environ``.
        search: Folders to look in for ``<name>.toml``.

    Raises:
        SiteInvalid: The file is missing, not TOML, or a field is invalid. The
            message names the file and the dotted field; ``details`` has
            ``file``, ``field`` and ``expected``.
    """
    path = find_site_file(name_or_path, search)
    file = str(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise SiteInvalid(
            f"{file}: cannot read the site config ({type(exc).__name__})",
            details={"file": file, "field": None, "expected": "a readable UTF-8 file"},
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise SiteInvalid(
            f"{file}: not valid TOML ({exc})",
            details={"file": file, "field": None, "expected": "TOML"},
        ) from None
    data = _expand(raw, os.environ if env is None else env, "", file)
    data.setdefault("name", path.stem)
    try:
        site = SiteConfig.model_validate(data)
    except ValidationError as exc:
        raise _site_invalid(file, exc) from None
    site._source = file
    return site


def _site_invalid(file: str, exc: ValidationError) -> SiteInvalid:
    """Turn pydantic errors into one ``SiteInvalid`` naming fields, never values."""
    problems: list[dict[str, str]] = []
    for error in exc.errors(include_url=False, include_input=False, include_context=False):
        # A discriminated union puts the chosen tag in the location; drop it.
        loc = [str(p) for p in error.get("loc", ())]
        if len(loc) >= 2 and loc[0] == "backend" and loc[1] in {"local", "dask", "radical_pilot"}:
            loc.pop(1)
        field = ".".join(loc) or "(top level)"
        message = error.get("msg", "invalid")
        kind = error.get("type")
        if kind in {"union_tag_invalid", "union_tag_not_found"}:
            # pydantic's message would repeat the bad tag; name the choices instead.
            field = f"{field}.kind"
            message = "expected kind 'local', 'dask' or 'radical_pilot'"
        elif kind == "extra_forbidden":
            message = "unknown field"
        elif kind == "missing":
            message = "required field is missing"
        elif kind == "value_error":
            message = message.removeprefix("Value error, ")
        problems.append({"field": field, "expected": message})
    first = problems[0] if problems else {"field": "(top level)", "expected": "a valid site"}
    listed = "; ".join(f"field {p['field']}: {p['expected']}" for p in problems)
    return SiteInvalid(
        f"{file}: {listed}",
        details={
            "file": file,
            "field": first["field"],
            "expected": first["expected"],
            "errors": problems,
        },
    )
