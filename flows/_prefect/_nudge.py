"""Wake the login node's runner: a new or resumed run starts now, not at the next poll.

``unattended submit`` and ``approve`` send ``NUDGE_SIGNAL`` to the runner of their
state directory; its watch loop (``flows._prefect._runner.Nudges``) then syncs
deployments and polls at once. A resume from the UI is not nudged and waits for
the runner's poll (``RUNNER_QUERY_SECONDS``). Imports no Prefect: ``approve`` stays fast.
"""

from __future__ import annotations

import os
import signal
from typing import Final

import psutil

NUDGE_SIGNAL: Final = signal.SIGUSR1
# How a runner's command line names the program: ``python -m flows._cli serve`` (what
# ``unattended run`` and ``serve --detach`` start) or the ``unattended serve`` script.
_RUNNER_PROGRAMS: Final = frozenset({"flows._cli", "unattended"})


def nudge_runner(pid: int) -> bool:
    """Send ``NUDGE_SIGNAL`` to the runner ``pid`` if it is one; return whether it was sent."""
    try:
        command = psutil.Process(pid).cmdline()
    except (psutil.Error, OSError):
        return False
    # A recycled pid must not get a signal whose default action ends the process.
    if not is_runner_command(command):
        return False
    try:
        os.kill(pid, NUDGE_SIGNAL)
    except OSError:
        return False
    return True


def is_runner_command(command: list[str]) -> bool:
    """Return whether ``command`` (a process's argv) is an ``unattended serve`` runner."""
    programs = {os.path.basename(part) for part in command}
    return "serve" in command and bool(programs & _RUNNER_PROGRAMS)
