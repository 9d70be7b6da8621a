"""Every environment variable unattended reads, in one settings object.

``Settings.from_env(env)`` reads the ``UNATTENDED_*`` variables (and the two
Slurm variables that say when the allocation starts and ends) from the mapping
it is given, never from the process: callers pass ``os.environ`` at the edge,
tests pass a dict. A bad value is a :class:`policies.SpecInvalid` naming the
variable and the field, never echoing the value (a database URL may hold a
password). Empty variables count as unset.

The table in ``docs/settings.md`` is this class's fields; a test keeps them the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, Field, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from policies import SpecInvalid

# Epoch seconds: 0 up to the year 9999 (what ``datetime`` can hold).
_EPOCH_MAX = 253_402_300_799.0


class Settings(BaseSettings):
    """The settings unattended reads from its environment.

    Build it with :meth:`from_env`; constructing it directly takes field names
    and reads no environment at all.
    """

    model_config = SettingsConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    home: Path | None = Field(
        default=None,
        validation_alias=AliasChoices("UNATTENDED_HOME", "home"),
        description=(
            "State directory on the login node (campaigns, provenance, Prefect's home); "
            "default ~/.unattended."
        ),
    )
    failpoints: str = Field(
        default="",
        max_length=4096,
        pattern=r"^[A-Za-z_:0-9,\s]*$",
        validation_alias=AliasChoices("UNATTENDED_FAILPOINTS", "failpoints"),
        description=(
            "Crash testing only: 'name:N[:action][,...]' kills the campaign process with "
            "SIGKILL (action 'kill', the default) or stops it with SIGSTOP ('stop') the Nth "
            "time it passes failpoint 'name' (docs/reliability.md)."
        ),
    )
    allocation_end: float | None = Field(
        default=None,
        ge=0,
        le=_EPOCH_MAX,
        validation_alias=AliasChoices("UNATTENDED_ALLOCATION_END", "allocation_end"),
        description=(
            "When the batch allocation ends, in epoch seconds; wins over SLURM_JOB_END_TIME. "
            "PBS job scripts set it (PBS exports no end time)."
        ),
    )
    allocation_start: float | None = Field(
        default=None,
        ge=0,
        le=_EPOCH_MAX,
        validation_alias=AliasChoices("UNATTENDED_ALLOCATION_START", "allocation_start"),
        description=(
            "When the batch allocation started, in epoch seconds; with the site's "
            "scheduler.walltime it gives the end when no end time is set."
        ),
    )
    slurm_job_end_time: float | None = Field(
        default=None,
        ge=0,
        le=_EPOCH_MAX,
        validation_alias=AliasChoices("SLURM_JOB_END_TIME", "slurm_job_end_time"),
        description="Set by Slurm 23.02 and later inside a job: its end, in epoch seconds.",
    )
    slurm_job_start_time: float | None = Field(
        default=None,
        ge=0,
        le=_EPOCH_MAX,
        validation_alias=AliasChoices("SLURM_JOB_START_TIME", "slurm_job_start_time"),
        description="Set by Slurm 23.02 and later inside a job: its start, in epoch seconds.",
    )
    server_host: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        validation_alias=AliasChoices("UNATTENDED_SERVER_HOST", "server_host"),
        description="Default address of 'unattended server start' (127.0.0.1 when unset).",
    )
    server_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        validation_alias=AliasChoices("UNATTENDED_SERVER_PORT", "server_port"),
        description="Default TCP port of 'unattended server start' (4200 when unset).",
    )
    prefect_database_url: str | None = Field(
        default=None,
        min_length=1,
        max_length=2048,
        validation_alias=AliasChoices("UNATTENDED_PREFECT_DATABASE_URL", "prefect_database_url"),
        description=(
            "Default database of 'unattended server start': a postgresql+asyncpg:// URL "
            "(SQLite under the state directory when unset)."
        ),
    )
    server_auth: bool | None = Field(
        default=None,
        validation_alias=AliasChoices("UNATTENDED_SERVER_AUTH", "server_auth"),
        description=(
            "Whether 'unattended server start' requires basic authentication (on when unset; "
            "the secret is generated into <state_dir>/prefect/api-auth, mode 0600)."
        ),
    )

    server_busy_retry_seconds: float = Field(
        default=3.0,
        ge=0,
        le=60,
        validation_alias=AliasChoices(
            "UNATTENDED_SERVER_BUSY_RETRY_SECONDS", "server_busy_retry_seconds"
        ),
        description=(
            "How long the server runs a request again while Prefect answers it 503 (a busy "
            "database) before the 503 goes to the client (seconds; 0: never)."
        ),
    )

    server_answer_retry_seconds: float = Field(
        default=30.0,
        ge=0,
        le=600,
        validation_alias=AliasChoices(
            "UNATTENDED_SERVER_ANSWER_RETRY_SECONDS", "server_answer_retry_seconds"
        ),
        description=(
            "How long the server runs a person's answer (a run's resume or input) again while "
            "Prefect answers it 503, other requests waiting to start meanwhile (seconds, at "
            "least the busy retry; 0: like any other request)."
        ),
    )

    lease_ttl_seconds: float = Field(
        default=60.0,
        ge=1,
        le=3600,
        validation_alias=AliasChoices("UNATTENDED_LEASE_TTL_SECONDS", "lease_ttl_seconds"),
        description="A campaign lease not renewed for this long has expired (seconds).",
    )
    heartbeat_seconds: float = Field(
        default=10.0,
        ge=0.2,
        le=600,
        validation_alias=AliasChoices("UNATTENDED_HEARTBEAT_SECONDS", "heartbeat_seconds"),
        description="How often a live run renews its campaign lease (seconds; below the TTL).",
    )
    watchdog_seconds: float = Field(
        default=2.0,
        ge=0.2,
        le=600,
        validation_alias=AliasChoices("UNATTENDED_WATCHDOG_SECONDS", "watchdog_seconds"),
        description="How often the runner's watchdog looks for orphaned runs (seconds).",
    )
    server_start_seconds: float = Field(
        default=120.0,
        ge=1,
        le=3600,
        validation_alias=AliasChoices("UNATTENDED_SERVER_START_SECONDS", "server_start_seconds"),
        description=(
            "How long 'server start', 'up' and 'run' wait for a Prefect server they started "
            "to answer /health before they stop it and fail (seconds). A loaded login node "
            "has taken over 60 s."
        ),
    )
    runner_start_seconds: float = Field(
        default=120.0,
        ge=1,
        le=3600,
        validation_alias=AliasChoices("UNATTENDED_RUNNER_START_SECONDS", "runner_start_seconds"),
        description=(
            "How long 'serve --detach', 'up' and 'run' wait for a runner they started to "
            "serve before they stop it and fail (seconds)."
        ),
    )
    max_continuations: int = Field(
        default=5,
        ge=1,
        le=100,
        validation_alias=AliasChoices("UNATTENDED_MAX_CONTINUATIONS", "max_continuations"),
        description=(
            "Automatic continuations of a crashed or failed run in a row without progress "
            "before the campaign is stopped (continuations_exhausted)."
        ),
    )
    storage_retries: int = Field(
        default=6,
        ge=1,
        le=50,
        validation_alias=AliasChoices("UNATTENDED_STORAGE_RETRIES", "storage_retries"),
        description="Attempts in all at a write the file system refused (disk full, read-only).",
    )
    storage_backoff_seconds: float = Field(
        default=1.0,
        ge=0,
        le=30,
        validation_alias=AliasChoices(
            "UNATTENDED_STORAGE_BACKOFF_SECONDS", "storage_backoff_seconds"
        ),
        description="Seconds before the second such attempt; doubled each time, at most 30 s.",
    )
    check_simulation: Literal["auto", "always", "never"] = Field(
        default="auto",
        validation_alias=AliasChoices("UNATTENDED_CHECK_SIMULATION", "check_simulation"),
        description=(
            "Whether the checks run the simulation once on the first fallback candidate: "
            "auto: 'check' runs it when the site runs tasks here (scheduler 'none') and its "
            "cost model says one takes at most check_simulation_seconds, submit and run do "
            "not; always: check, submit and run run it; never: nothing runs it."
        ),
    )
    check_simulation_seconds: float = Field(
        default=60.0,
        ge=1,
        le=3600,
        validation_alias=AliasChoices(
            "UNATTENDED_CHECK_SIMULATION_SECONDS", "check_simulation_seconds"
        ),
        description="How long the check's simulation run may take before it is refused (seconds).",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Read only what the caller passes: never the process environment or a file."""
        return (init_settings,)

    @classmethod
    def variables(cls) -> dict[str, str]:
        """Return ``{field: environment variable}`` for every setting."""
        return {name: _variable(info) for name, info in cls.model_fields.items()}

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Return the settings in ``env``; raise ``SpecInvalid`` naming a bad variable."""
        variables = cls.variables()
        given: dict[str, Any] = {
            name: env[variable] for name, variable in variables.items() if env.get(variable)
        }
        try:
            return cls(**given)
        except ValidationError as exc:
            error = exc.errors()[0]
            field = str(error["loc"][0]) if error["loc"] else "?"
            variable = variables.get(field, field)
            # The field and pydantic's message only: the value may be a URL with a password.
            raise SpecInvalid(
                f"invalid setting {field} (environment variable {variable}): {error['msg']}",
                details={"field": field, "source": f"environment variable {variable}"},
            ) from None

    def allocation_window(self, walltime_seconds: float | None = None) -> AllocationWindow:
        """Return when the batch allocation started and ends, as far as this process knows.

        The end is ``UNATTENDED_ALLOCATION_END``, else ``SLURM_JOB_END_TIME``, else
        the start plus ``walltime_seconds`` (the site's ``scheduler.walltime``).
        The start is ``UNATTENDED_ALLOCATION_START``, else ``SLURM_JOB_START_TIME``.
        """
        start = _first(self.allocation_start, self.slurm_job_start_time)
        end = _first(self.allocation_end, self.slurm_job_end_time)
        if end is None and start is not None and walltime_seconds is not None:
            end = start + walltime_seconds
        return AllocationWindow(start=_moment(start), end=_moment(end))


@dataclass(frozen=True)
class AllocationWindow:
    """When the batch allocation started and ends (aware UTC; None when unknown)."""

    start: datetime | None
    end: datetime | None

    def remaining(self, now: datetime) -> float | None:
        """Return seconds left until the end (never negative), or None when unknown."""
        if self.end is None:
            return None
        return max(0.0, (self.end - now).total_seconds())


def _variable(info: FieldInfo) -> str:
    alias = info.validation_alias
    assert isinstance(alias, AliasChoices)  # every field names its variable first
    first = alias.choices[0]
    assert isinstance(first, str)
    return first


def _first(*values: float | None) -> float | None:
    return next((v for v in values if v is not None), None)


def _moment(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC)
