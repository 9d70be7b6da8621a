"""The docs' login node, shared by the blocks of test_docs_run (see docs_shell.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from flows._prefect._server import ServerHandle, client_env

sys.path.insert(0, str(Path(__file__).resolve().parent))  # importlib mode: docs_shell
from docs_shell import NOT_LINKED, PROJECT, VENV_BIN, DocsShell, expect, free_port


@pytest.fixture(scope="module")
def docs_shell(
    prefect_server: ServerHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DocsShell]:
    """Return the shell after running both demos (the approval one approved by alice)."""
    root = tmp_path_factory.mktemp("docs")
    workdir, user_home = root / "work", root / "user"
    home = user_home / ".unattended"  # the default state directory, spelt out
    for folder in (workdir, user_home):
        folder.mkdir()
    for entry in PROJECT.iterdir():
        if entry.name not in NOT_LINKED:
            (workdir / entry.name).symlink_to(entry)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("UNATTENDED_", "PREFECT_", "SLURM_")) and k != "DO_NOT_TRACK"
    }
    env |= client_env(prefect_server)
    env |= {
        "UNATTENDED_HOME": str(home),
        "HOME": str(user_home),
        # A block that starts the local server (docs/server.md) must not take 4200.
        "UNATTENDED_SERVER_PORT": str(free_port()),
        "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        # Results of this module's runs only (the session's server is shared).
        "PREFECT_LOCAL_STORAGE_PATH": str(root / "prefect-results"),
        "COLUMNS": "120",
    }
    shell = DocsShell(workdir, home, env)
    try:
        expect(shell.cli("run", "examples/demo/campaign.toml"), 0)
        expect(shell.cli("run", "examples/demo/campaign-approval.toml", "--no-wait"), 5)
        listed = subprocess.run(
            [str(VENV_BIN / "unattended"), "approvals", "--json"],
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        waiting = json.loads(listed.stdout)["approvals"]
        assert len(waiting) == 1, listed.stdout
        expect(shell.cli("approve", waiting[0]["flow_run_id"], "--as", "alice"), 0)
        expect(shell.cli("run", "examples/demo/campaign-approval.toml"), 0)
        yield shell
    finally:
        shell.cli("serve", "--stop")
