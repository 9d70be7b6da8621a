"""What an approver may ask of the server: an allowlist of (method, route), the rest is the owner's.

Prefect OSS has no roles: whoever holds its one secret may do anything. Behind
``flows._prefect._identity`` an approver's login may only read what the UI shows of
runs (Prefect reads with ``GET`` and with ``POST .../filter``, ``.../count``,
``.../paginate``) and resume a run (checked further by ``_identity_resume``). Never
allowed, even as reads: run inputs (``/flow_runs/{id}/input...``: answers and one-time
codes live there; only a waiting form's schema and description are shown), blocks
(credentials), variables, settings. Anything not listed is
refused (403), so a route a new Prefect adds is the owner's until it is listed here.

Paths are matched below ``/api``. Nothing here imports Prefect.
"""

from __future__ import annotations

import re
from typing import Final, Literal

_ID = r"[0-9a-fA-F-]{36}"
_NAME = r"[^/]+"
# Resources whose filter/count/paginate only read (Prefect's read routes are POSTs with a body).
_READ_RESOURCES = (
    "flow_runs",
    "task_runs",
    "flows",
    "deployments",
    "artifacts",
    "artifacts/latest",
    "logs",
    "events",
    "flow_run_states",
    "task_run_states",
    "work_pools",
    "work_queues",
    "automations",
    "saved_searches",
    "concurrency_limits",
    "v2/concurrency_limits",
)
_READS_BY_POST = "|".join(re.escape(r) for r in _READ_RESOURCES)

APPROVER_GET: Final = tuple(
    re.compile(pattern)
    for pattern in (
        r"/(health|ready|version|admin/version|csrf-token)",
        rf"/flow_runs/{_ID}(/graph|/graph-v2)?",
        rf"/task_runs/{_ID}",
        rf"/flows/{_ID}",
        rf"/flows/name/{_NAME}",
        rf"/deployments/{_ID}(/schedules)?",
        rf"/deployments/name/{_NAME}/{_NAME}",
        rf"/artifacts/{_ID}",
        rf"/artifacts/{_NAME}/latest",
        rf"/flow_run_states/({_ID})?",
        rf"/task_run_states/({_ID})?",
        rf"/work_pools/{_NAME}",
        rf"/work_pools/{_NAME}/queues/{_NAME}",
        rf"/work_queues/{_ID}",
        rf"/automations/{_ID}",
        rf"/automations/related-to/{_NAME}",
        r"/events/filter/next",
    )
)
APPROVER_POST: Final = tuple(
    re.compile(pattern)
    for pattern in (
        rf"/({_READS_BY_POST})/(filter|count|paginate)",
        r"/(flow_runs|task_runs)/history",
        r"/flow_runs/lateness",
        r"/events/count-by/[a-z_]+",
        rf"/work_pools/{_NAME}/(workers|queues)/filter",
        r"/ui/flow_runs/(history|count-task-runs)",
        r"/ui/flows/(count-deployments|next-runs)",
        r"/ui/task_runs/(dashboard/counts|count)",
        r"/ui/schemas/validate",
    )
)
# The waiting form's own inputs: its JSON schema and its markdown (never "-response").
FORM: Final = re.compile(rf"/flow_runs/{_ID}/input/(suspended|paused)-[^/]+-(schema|description)")
RESUME: Final = re.compile(rf"/flow_runs/(?P<id>{_ID})/resume")
# Streams an approver may read (the UI's live logs and events), and nothing else.
APPROVER_SOCKETS: Final = frozenset({"/events/out", "/logs/out"})
# Prefect answers these without a login (health probes).
OPEN: Final = frozenset({("GET", "/health"), ("GET", "/ready")})

Access = Literal["read", "resume", "refused"]


def approver_access(method: str, path: str) -> Access:
    """Return what an approver's request to ``path`` (below ``/api``) is: a read, a resume, neither.

    Deny by default: only the listed reads, and ``POST /flow_runs/{id}/resume``
    (which ``_identity_resume`` checks against the campaign's waiting request).
    """
    if "/input" in path:
        # Run inputs hold the answers: never an approver's to read. The form a run waits
        # with (its schema and description, written by the flow) is what the UI shows.
        return "read" if method == "GET" and FORM.fullmatch(path) else "refused"
    if method in ("GET", "HEAD"):
        return "read" if any(p.fullmatch(path) for p in APPROVER_GET) else "refused"
    if method == "POST":
        if RESUME.fullmatch(path):
            return "resume"
        return "read" if any(p.fullmatch(path) for p in APPROVER_POST) else "refused"
    return "refused"
