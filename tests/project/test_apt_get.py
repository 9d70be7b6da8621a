"""A test that cannot install the Debian packages it needs says what to install.

Run as another, unprivileged user (``nobody``) with no ``sudo`` on its PATH, as on a
login node where the suite may not install anything: ``apt_install`` gives up at once,
and its reason ends with the command to run by hand.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]


def test_without_root_or_sudo_the_reason_names_the_command_to_run() -> None:
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("APT SKIP TEST SKIPPED: needs root and setpriv to run as user nobody")
    script = (
        f"import sys; sys.path.insert(0, {str(TESTS)!r}); from apt_get import apt_install; "
        "print(apt_install(['slurm-wlm', 'munge'], 5))"
    )
    as_nobody = [setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    done = subprocess.run(
        [*as_nobody, sys.executable, "-I", "-c", script],
        env={"PATH": "/nonexistent", "HOME": "/nonexistent"},
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        'not root and no sudo; install them with "sudo apt-get update && '
        'sudo apt-get install -y slurm-wlm munge"'
    )
