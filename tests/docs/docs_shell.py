"""A login node for the docs' blocks: one state directory, the session's server, the demos run.

The docs assume a sequence (run the demo, then inspect, export, report, replay it), so
every block of the module shares one ``DocsShell``: a working directory that looks like
the repository (its top-level entries symlinked, so ``examples/...`` and ``.venv/bin/...``
resolve while ``./demo-report`` lands in a temporary folder), ``UNATTENDED_HOME`` and
``HOME`` of its own, and the session's Prefect server. Before the first block it runs both
demo campaigns through the real command line, answering the approval demo's request as
``alice``, exactly as README.md and docs/index.md tell a new user to.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
VENV_BIN = PROJECT / ".venv" / "bin"
# Entries of the repository a doc's block must not see or write through its symlink.
NOT_LINKED = {".git", ".mypy_cache", ".ruff_cache", ".pytest_cache", "site", "__pycache__"}


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class DocsShell:
    """A shell on a login node where the user followed the README so far."""

    workdir: Path
    home: Path
    env: dict[str, str]

    def run(self, args: list[str], *, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        """Run ``args`` in the working directory, stdout and stderr merged as on a terminal."""
        # Output to a file, not a pipe: something a block left running in the background
        # (a server it started, say) would hold a pipe open after the block ended.
        with tempfile.TemporaryFile("w+") as out:
            process = subprocess.Popen(
                args,
                cwd=self.workdir,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
            try:
                process.wait(timeout=timeout)
            finally:
                # End whatever the block left behind in its session, with the block.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            out.seek(0)
            printed = out.read()
        return subprocess.CompletedProcess(args, process.returncode, printed)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run([str(VENV_BIN / "unattended"), *args])


def expect(done: subprocess.CompletedProcess[str], code: int) -> None:
    assert done.returncode == code, f"{done.args} exited {done.returncode}:\n{done.stdout}"
