"""Normal events at the level they deserve: waiting for a human, and asyncflow's shutdown."""

from __future__ import annotations

import logging

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
    def test_a_suspended_or_paused_run_ends_at_info_and_a_failed_one_stays_error(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        install_log_filters()
        logger = logging.getLogger(FLOW_RUN_LOGGER)
        with caplog.at_level(logging.DEBUG, logger=FLOW_RUN_LOGGER):
            for state in ("Suspended('waiting')", "Paused()", "Failed('boom')"):
                # Once Prefect is imported its API handler is on this logger; outside a
                # flow run it must be told not to ship the record.
                logger.error("Finished in state %s", state, extra={"send_to_api": False})

        assert _levels(caplog, FLOW_RUN_LOGGER) == {
            "Finished in state Suspended('waiting')": "INFO",
            "Finished in state Paused()": "INFO",
            "Finished in state Failed('boom')": "ERROR",
        }

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
