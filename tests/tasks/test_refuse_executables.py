"""A retiring Dask worker starts no executable once its running ones are killed.

``kill_task_groups`` (run on a worker whose job ended) pauses the worker, refuses
new executables, then kills the running ones: a task the worker had already taken
but not yet spawned must not start its program after the scan, or it would outlive
the worker and complete twice. Checked in a child process: the refusal is for the
whole process, as on the worker.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

PROGRAM = textwrap.dedent(
    """
    import json, sys
    from tasks._executables import refuse_new_executables, run_executable_blocking

    before = run_executable_blocking([sys.executable, "-c", "print(7)"], None, None, None, 30, 1)
    refuse_new_executables()
    after = run_executable_blocking(
        [sys.executable, "-c", "open(sys.argv[1], 'w')", sys.argv[1]], None, None, None, 30, 1
    )
    print(json.dumps({
        "before": [before.exit_code, before.stdout.strip()],
        "after": [after.exit_code, after.stderr_tail],
    }))
    """
)


def test_after_the_refusal_no_program_starts_and_the_task_reads_as_killed(tmp_path):
    marker = tmp_path / "started"
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(marker)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["before"] == [0, "7"]
    assert report["after"] == [-9, "not started: this worker is being retired"]
    assert not marker.exists()
