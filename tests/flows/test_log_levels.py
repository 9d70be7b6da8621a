"""Normal events at the level they deserve: waiting for a human, and asyncflow's shutdown."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from flows._prefect._logging import (
    ASYNCFLOW_LOGGER,
    FLOW_RUN_LOGGER,
    Demote,
    install_log_filters,
)


def _levels(caplog: pytest.LogCaptureFixture, logger: str) -> dict[str, str]:
    return {r.getMessage(): r.levelname for r in caplog.records if r.name == logger}


class TestLogFilters:
    def test_a_failed_run_s_own_finished_line_stays_error(self, prefect_server: Any) -> None:
        """Prefect's real line for a flow run that failed, from a real async run on the server."""
        from prefect import flow

        # An async flow, as the campaign's is: Prefect's async engine logs the line of a
        # run that did not complete at ERROR (the sync engine at INFO, whatever the state).
        @flow(name="log-levels-fails", persist_result=False)
        async def fails() -> None:
            raise ValueError("boom")

        install_log_filters()
        seen = _Records()
        logger = logging.getLogger(FLOW_RUN_LOGGER)
        logger.addHandler(seen)  # Prefect's loggers do not propagate to pytest's capture
        try:
            asyncio.run(fails(return_state=True))
        finally:
            logger.removeHandler(seen)

        finished = [(r.getMessage(), r.levelname) for r in seen.records]
        assert [(m.startswith("Finished in state Failed("), level) for m, level in finished] == [
            (True, "ERROR")
        ]

    @pytest.mark.integration
    @pytest.mark.timeout(300)
    def test_a_run_suspended_for_approval_ends_at_info_in_prefect_s_own_log(
        self, suspend_demo: Any, tmp_path: Path
    ) -> None:
        """The campaign run that suspends for approval: the line Prefect ships is INFO."""
        from flows._prefect._rest import request

        flow_run_id = suspend_demo(tmp_path, "log-levels")
        body = {"logs": {"flow_run_id": {"any_": [flow_run_id]}}, "sort": "TIMESTAMP_ASC"}
        logs = request(os.environ, "POST", "logs/filter", body)
        finished = [  # the flow run's own line, not its tasks' (they have a task run id)
            (log["message"], log["level"])
            for log in logs
            if log["message"].startswith("Finished in state") and not log["task_run_id"]
        ]
        assert [(m.startswith("Finished in state Suspended("), lv) for m, lv in finished] == [
            (True, logging.INFO)
        ]


class _Records(logging.Handler):
    """Keep the flow-run logger's "Finished in state" records, as its filters left them."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("Finished in state"):
            self.records.append(record)


class TestOtherLogFilters:
    def test_asyncflows_routine_shutdown_cancel_is_debug_and_a_timeout_stays_a_warning(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        install_log_filters()
        logger = logging.getLogger(ASYNCFLOW_LOGGER)
        with caplog.at_level(logging.DEBUG, logger=ASYNCFLOW_LOGGER):
            logger.warning("Internal components shutdown cancelled")
            logger.warning("Timeout waiting for internal components to shutdown")

        assert _levels(caplog, ASYNCFLOW_LOGGER) == {
            "Internal components shutdown cancelled": "DEBUG",
            "Timeout waiting for internal components to shutdown": "WARNING",
        }

    def test_installing_twice_adds_each_filter_once(self) -> None:
        install_log_filters()
        install_log_filters()
        # Only ours: once Prefect has configured logging its own filters are there too.
        for name in (FLOW_RUN_LOGGER, ASYNCFLOW_LOGGER):
            ours = [f for f in logging.getLogger(name).filters if isinstance(f, Demote)]
            assert len(ours) == 1, name
