"""The execution backends a site config can choose, by ``backend.kind``."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_STRICT = ConfigDict(extra="forbid", frozen=True)
_SCHEDULER_ADDRESS = re.compile(r"^(tcp|tls|ucx|inproc)://\S+$")
#: A value still to be filled in, such as ``<YOUR_ALLOCATION>``.
PLACEHOLDER = re.compile(r"^<[A-Z0-9_ ]+>$")


class LocalBackend(BaseModel):
    """Everything on this machine: a process pool (default) or a bounded thread pool."""

    model_config = _STRICT

    kind: Literal["local"] = Field(description="Selects this backend.")
    executor: Literal["process", "thread"] = Field(
        default="process",
        description="Pool for function tasks: processes (isolated, parallel) or threads.",
    )
    max_workers: int | None = Field(
        default=None, ge=1, le=4096, description="Pool size; default: the machine's CPU count."
    )
    start_method: Literal["fork", "forkserver", "spawn"] | None = Field(
        default=None, description="multiprocessing start method of the process pool."
    )
    dispatch: Literal["direct", "engine"] = Field(
        default="direct",
        description=(
            "direct: function tasks go straight to the pool asyncflow's backend wraps "
            "(asyncflow's per-task bookkeeping costs ~N²); engine: through asyncflow's "
            "WorkflowEngine like the allocation backends."
        ),
    )


class JobqueueConfig(BaseModel):
    """Dask workers started as batch jobs by dask-jobqueue (optional extra)."""

    model_config = _STRICT

    system: Literal["slurm", "pbs", "sge", "lsf"] = Field(description="Batch system.")
    cores: int = Field(ge=1, le=4096, description="Cores per job.")
    memory: str = Field(
        pattern=r"^\d+(\.\d+)?\s*[KMGT]i?B$", description="Memory per job, e.g. '64GB'."
    )
    jobs: int = Field(
        default=1, ge=1, le=10_000, description="Batch jobs of one allocation (worker groups)."
    )
    processes: int = Field(default=1, ge=1, le=1024, description="Worker processes per job.")
    interface: str | None = Field(
        default=None,
        max_length=32,
        description=(
            "Network interface compute nodes reach the scheduler on, e.g. 'ib0'; without "
            "one the scheduler listens on the site's `listen` address only."
        ),
    )
    job_extra_directives: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Extra '#SBATCH'/'#PBS' options, e.g. '--exclusive' or '--constraint=cpu'.",
    )
    python: str | None = Field(
        default=None,
        max_length=4096,
        description="Python the workers run (default: the campaign's own interpreter).",
    )


class DaskBackend(BaseModel):
    """A Dask cluster: an existing scheduler, a local cluster, or dask-jobqueue."""

    model_config = _STRICT

    kind: Literal["dask"] = Field(description="Selects this backend.")
    scheduler_address: str | None = Field(
        default=None, description="Existing scheduler, e.g. 'tcp://10.0.0.5:8786'."
    )
    cluster: Literal["local"] | None = Field(
        default=None, description="'local': start a distributed.LocalCluster on the listen host."
    )
    n_workers: int = Field(default=2, ge=1, le=1024, description="LocalCluster workers.")
    threads_per_worker: int = Field(default=1, ge=1, le=256, description="Threads per worker.")
    jobqueue: JobqueueConfig | None = Field(
        default=None, description="Start workers as batch jobs (needs dask-jobqueue)."
    )

    @field_validator("scheduler_address")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is not None and not (_SCHEDULER_ADDRESS.match(value) or PLACEHOLDER.match(value)):
            raise ValueError("expected a scheduler address like 'tcp://host:8786'")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> DaskBackend:
        chosen = [
            name
            for name, value in (
                ("scheduler_address", self.scheduler_address),
                ("cluster", self.cluster),
                ("jobqueue", self.jobqueue),
            )
            if value is not None
        ]
        if len(chosen) != 1:
            raise ValueError(
                'set exactly one of scheduler_address, cluster = "local" or [backend.jobqueue]'
            )
        return self


class RadicalPilotBackend(BaseModel):
    """RADICAL-Pilot through rhapsody (optional extra ``unattended[radical-pilot]``)."""

    model_config = _STRICT

    kind: Literal["radical_pilot"] = Field(description="Selects this backend.")
    resource: str = Field(
        min_length=1,
        max_length=128,
        description=(
            "RADICAL-Pilot resource label, e.g. 'tacc.frontera'; 'unattended.slurm' writes "
            "one from [scheduler] for a Slurm cluster RADICAL-Pilot does not know."
        ),
    )
    cores: int = Field(ge=1, le=10_000_000, description="Cores of the pilot.")
    gpus: int = Field(default=0, ge=0, le=1_000_000, description="GPUs of the pilot.")
    runtime_minutes: int = Field(ge=1, le=525_600, description="Pilot walltime in minutes.")
    queue: str | None = Field(
        default=None, max_length=128, description="Batch queue (default: scheduler.partition)."
    )
    project: str | None = Field(
        default=None, max_length=128, description="Allocation/project (default: scheduler.account)."
    )
    cores_per_node: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="Cores of one node, for the 'unattended.slurm' resource (default: cores).",
    )


Backend = Annotated[LocalBackend | DaskBackend | RadicalPilotBackend, Field(discriminator="kind")]
