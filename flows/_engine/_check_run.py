"""The check's one run of a campaign's simulation, judged as a batch's result would be.

``unattended check`` (``flows._check``) runs the simulation once on round 0's first
fallback candidate when it is cheap and local, so a program that cannot produce a
value is refused before anything is submitted, naming the simulation and the code
(``bad_output``, ``task_failed``) a batch would have recorded for it.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from collections.abc import Sequence

from flows._engine._simulation import campaign_simulation
from flows._spec import LoadedSpec
from tasks import BAD_OUTPUT, ExecutableTask, TaskResult, stdout_value


def check_run(loaded: LoadedSpec, candidate: Sequence[float], seconds: float) -> str | None:
    """Run the campaign's simulation once on ``candidate``; return why it fails, or None.

    The run is the task a batch would launch for it as round 0's candidate 0 (same
    argv, stdin, fills), judged by the rules a batch's results are judged by: a
    non-zero exit is ``task_failed``, stdout that is not JSON or holds no objective
    ``bad_output``. It is killed (its whole process group) after ``seconds``.
    """
    simulation = campaign_simulation(loaded)
    name = loaded.spec.name
    task = simulation.task_for([float(x) for x in candidate], index=0, campaign=name, round_index=0)
    assert isinstance(task, ExecutableTask)  # a campaign's simulation is a program
    command = shlex.join(task.argv)
    shown = command if len(command) <= 160 else command[:157] + "..."
    who = f"simulation {simulation.id} ({shown})"
    started = time.monotonic()
    try:
        process = subprocess.Popen(  # the spec's own program, no shell
            task.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=task.cwd,
            env=task.env,
            start_new_session=True,
        )
    except OSError as exc:
        return f"{who} did not start: {exc.strerror or type(exc).__name__}"
    try:
        out, err = process.communicate(task.stdin, timeout=seconds)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return (
            f"{who} ran once on round 0's first fallback candidate and did not finish within "
            f"{seconds:g} s (check_simulation_seconds)"
        )
    stdout, stderr = (b.decode("utf-8", errors="replace") for b in (out, err))
    ran = f"{who} ran once on round 0's first fallback candidate and"
    if process.returncode != 0:
        return (
            f"{ran} exited with code {process.returncode} (task_failed); "
            f"stderr ends: {_shown(stderr)}"
        )
    try:
        value = stdout_value(stdout)
    except ValueError:
        return f"{ran} its stdout is not JSON ({BAD_OUTPUT}): {_shown(stdout)}; {_EXPECTED}"
    done = TaskResult(
        index=0,
        key=f"{name}/check/0",
        status="done",
        value=value,
        runtime=time.monotonic() - started,
        host="check",
        attempts=1,
    )
    if simulation.judged(done).ok:
        return None
    return f"{ran} wrote no value the objective reads ({BAD_OUTPUT}): {_shown(stdout)}; {_EXPECTED}"


_EXPECTED = 'it must write a number or {"value": <finite number>} on stdout'


def _shown(text: str, limit: int = 120) -> str:
    """Return the end of a stream as a quoted one-liner (``(nothing)`` when empty)."""
    text = text.strip()
    if not text:
        return "(nothing)"
    return repr(text if len(text) <= limit else "..." + text[-limit:])
