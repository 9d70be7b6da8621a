"""Log normal events at the level they deserve, on loggers Prefect and asyncflow own.

- Prefect 3.9's async flow engine logs ``Finished in state <state>`` at ERROR for
  every state that is not Completed, so each approval request (a Suspended run,
  or a Paused one) reads as an error in the runner's log. That one message, for
  those two states only, is demoted to INFO; a Failed or Crashed run stays ERROR.
- radical.asyncflow 0.6 logs ``Internal components shutdown cancelled`` as a
  WARNING during its own routine shutdown; it is demoted to DEBUG.

Written against Prefect 3.9.1 (``prefect/flow_engine.py``) and asyncflow 0.6.0
(``radical/asyncflow/workflow_manager.py``). The filters match the message text,
so a version that words it differently is simply not demoted. The flow-run
process installs them when it imports the campaign flow.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

# The logger the flow engine's run logger adapts (prefect.logging.loggers.flow_run_logger).
FLOW_RUN_LOGGER: Final = "prefect.flow_runs"
ASYNCFLOW_LOGGER: Final = "radical.asyncflow.workflow_manager"
_WAITING_STATES: Final = ("Finished in state Suspended", "Finished in state Paused")
_ROUTINE_SHUTDOWN: Final = "Internal components shutdown cancelled"


class Demote(logging.Filter):
    """Lower the level of the records whose message ``matches`` to ``level``."""

    def __init__(self, matches: Callable[[str], bool], level: int) -> None:
        super().__init__()
        self.matches = matches
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite the record's level when it is one of the routine events."""
        if record.levelno > self.level and self.matches(record.getMessage()):
            record.levelno = self.level
            record.levelname = logging.getLevelName(self.level)
        return True


_FILTERS: Final = {
    FLOW_RUN_LOGGER: Demote(lambda message: message.startswith(_WAITING_STATES), logging.INFO),
    ASYNCFLOW_LOGGER: Demote(lambda message: message == _ROUTINE_SHUTDOWN, logging.DEBUG),
}


def install_log_filters() -> None:
    """Attach the filters to Prefect's flow-run logger and asyncflow's, once per process."""
    for name, demote in _FILTERS.items():
        logger = logging.getLogger(name)
        if demote not in logger.filters:
            logger.addFilter(demote)
