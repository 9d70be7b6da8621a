"""What an approver's login may ask of the server, which run is a campaign's, how fast guesses go.

Pure rules, no server: the allowlist (deny by default), the current-run rule the flow
and the server share, and the failed-login bucket. The server-side behaviour is
tested through a real server in ``tests/reliability/service/test_approver_identity.py``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from flows._prefect._current_run import current_run
from flows._prefect._identity import FailedLogins
from flows._prefect._identity_rules import approver_access

RUN = "3d74a1b9-8986-4595-96f3-70b5eec6a31c"


class TestTheAllowlist:
    @pytest.mark.parametrize(
        ("method", "path", "access"),
        [
            ("GET", f"/flow_runs/{RUN}", "read"),
            ("POST", "/flow_runs/filter", "read"),
            ("POST", "/logs/filter", "read"),
            ("POST", "/ui/flow_runs/history", "read"),
            ("GET", f"/flow_runs/{RUN}/input/suspended-demo-r2-c1-n0-schema", "read"),
            ("GET", f"/flow_runs/{RUN}/input/suspended-demo-r2-c1-n0-description", "read"),
            ("POST", f"/flow_runs/{RUN}/resume", "resume"),
            # The answers, codes included, and anything that writes: the owner's alone.
            ("GET", f"/flow_runs/{RUN}/input/suspended-demo-r2-c1-n0-response", "refused"),
            ("GET", f"/flow_runs/{RUN}/input/suspended-x-schema/../y-response", "refused"),
            ("POST", f"/flow_runs/{RUN}/input/filter", "refused"),
            ("DELETE", f"/flow_runs/{RUN}/input/suspended-demo-r2-c1-n0-schema", "refused"),
            ("POST", "/flow_runs/", "refused"),
            ("POST", f"/flow_runs/{RUN}/set_state", "refused"),
            ("PATCH", f"/flow_runs/{RUN}", "refused"),
            ("DELETE", f"/flow_runs/{RUN}", "refused"),
            ("POST", f"/deployments/{RUN}/create_flow_run", "refused"),
            ("POST", "/block_documents/filter", "refused"),
            ("POST", "/variables/filter", "refused"),
            ("GET", "/admin/settings", "refused"),
            ("POST", "/work_pools/", "refused"),
            ("GET", "/something/prefect/adds/later", "refused"),
        ],
    )
    def test_an_approver_may_only_read_and_resume(
        self, method: str, path: str, access: str
    ) -> None:
        assert approver_access(method, path) == access


T0 = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


class TestTheCurrentRun:
    def test_is_the_oldest_run_that_has_not_ended(self) -> None:
        runs = [
            (T0, "a", "COMPLETED"),
            (T0 + timedelta(seconds=1), "b", "PAUSED"),  # the campaign's run, waiting
            (T0 + timedelta(seconds=2), "c", "RUNNING"),  # a clone made while b waits
        ]
        assert current_run(runs) == "b"

    def test_a_continuation_after_the_run_ended_is_current(self) -> None:
        runs = [(T0, "b", "CRASHED"), (T0 + timedelta(seconds=9), "d", "SCHEDULED")]
        assert current_run(runs) == "d"

    def test_none_when_every_run_ended(self) -> None:
        assert current_run([(T0, "b", "COMPLETED"), (T0, "c", "CANCELLED")]) is None


class TestFailedLogins:
    def test_a_few_at_once_then_about_two_a_second(self) -> None:
        bucket = FailedLogins(burst=3, per_second=2.0)
        for at in (0.0, 0.1, 0.2):
            assert not bucket.blocked("10.0.0.1", at)
            bucket.failed("10.0.0.1", at)
        assert bucket.blocked("10.0.0.1", 0.3)
        assert not bucket.blocked("10.0.0.2", 0.3)  # per client address
        assert not bucket.blocked("10.0.0.1", 1.61)  # the oldest failure aged out
