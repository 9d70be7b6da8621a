"""Install Debian packages for a test fixture, one apt-get at a time across processes.

The Slurm and browser fixtures install what is missing (``slurm-wlm``, ``chromium``) on a
fresh machine. The suite runs on several pytest-xdist workers, so both fixtures can start
at once; apt-get refuses a second concurrent run ("Could not get lock"), so every call
here holds an exclusive lock on one file for the whole update + install.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

_LOCK = Path(tempfile.gettempdir()) / "unattended-tests-apt-get.lock"


def apt_install(packages: Sequence[str], timeout: float) -> str | None:
    """Run ``apt-get update`` and ``apt-get install -y PACKAGES``; return why it failed, or None.

    The reason ends with the command that installs them by hand, so a test that
    skips on it says what to install.
    """
    why = _apt_install(packages, timeout)
    if why is None:
        return None
    return f'{why}; install them with "{install_command(packages)}"'


def install_command(packages: Sequence[str]) -> str:
    """Return the command a user runs to install ``packages`` (as root, or with sudo)."""
    sudo = "" if os.geteuid() == 0 else "sudo "
    return f"{sudo}apt-get update && {sudo}apt-get install -y {' '.join(packages)}"


def _apt_install(packages: Sequence[str], timeout: float) -> str | None:
    prefix: list[str] = []
    if os.geteuid() != 0:
        if shutil.which("sudo") is None:
            return "not root and no sudo"
        prefix = ["sudo", "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with _LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        for argv in (["apt-get", "update"], ["apt-get", "install", "-y", *packages]):
            try:
                done = subprocess.run(
                    prefix + argv, env=env, capture_output=True, timeout=timeout, check=False
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                return f"{' '.join(argv)}: {type(exc).__name__}"
            if done.returncode != 0:
                tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:]
                return f"{' '.join(argv)} exited {done.returncode}: {' '.join(tail)}"
    return None
