"""Run a command as another local Unix user, as a shared login node's users are.

The suite runs as root; the attacks it tests need a second account (a planted package
in a shared folder, a file another user made first). ``local_users(n)`` creates ``n``
throw-away users (``useradd -m``, random names, their own HOME and a private TMPDIR in
it), lets them reach this interpreter, its venv and the checkout, and deletes them (and
ends their processes, by pid) afterwards. ``LocalUser.run`` / ``LocalUser.popen`` run a
command as one of them (``setpriv``: no PAM, no capabilities, only the environment
given).

Not root, or no ``useradd``/``setpriv``: ``local_users`` skips the test, saying why.

Where this interpreter lives under a folder other users cannot enter (a pyenv under
``/root``, mode 0700), each user is granted search (``x``, not read) on that folder with
a POSIX ACL entry of its own (``setfacl``, the ``acl`` package, installed when missing),
removed again at the end: the real venv and the real ``unattended`` command run, as they
would from a login node's shared installation.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent  # the venv's bin: python and `unattended`
# Every name made here starts with it, so a leftover user is easy to tell apart.
USER_PREFIX = "utest"


@dataclass(frozen=True)
class LocalUser:
    """A throw-away local account: its name, ids, HOME and private TMPDIR."""

    name: str
    uid: int
    gid: int
    home: Path

    @property
    def tmpdir(self) -> Path:
        return self.home / "tmp"

    def env(self, **extra: str) -> dict[str, str]:
        """Return a login-like environment of this user: HOME, TMPDIR, PATH with the venv first."""
        base = {
            "HOME": str(self.home),
            "USER": self.name,
            "LOGNAME": self.name,
            "TMPDIR": str(self.tmpdir),
            "PATH": f"{VENV_BIN}{os.pathsep}/usr/local/bin{os.pathsep}/usr/bin{os.pathsep}/bin",
            "LANG": "C.UTF-8",
            "COLUMNS": "200",
        }
        return {**base, **extra}

    def argv(self, command: Sequence[str]) -> list[str]:
        """Return ``command`` wrapped to run as this user (its groups, no capabilities)."""
        return [
            "setpriv",
            f"--reuid={self.uid}",
            f"--regid={self.gid}",
            "--init-groups",
            "--",
            *command,
        ]

    def run(
        self,
        command: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str],
        timeout: float,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``command`` as this user in ``cwd`` with exactly ``env``; capture its output."""
        return subprocess.run(
            self.argv(command),
            cwd=cwd,
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def popen(self, command: Sequence[str], *, cwd: Path, env: Mapping[str, str], **kw: Any):
        """Start ``command`` as this user (``subprocess.Popen`` arguments in ``kw``)."""
        return subprocess.Popen(self.argv(command), cwd=cwd, env=dict(env), **kw)

    def pids(self) -> list[int]:
        """Return the pids of every process running as this user."""
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if entry.stat().st_uid == self.uid:
                        found.append(int(entry.name))
        return found

    def kill_all(self, *, grace: float = 10.0) -> None:
        """End this user's processes, each by its pid: SIGTERM, then SIGKILL after ``grace``."""
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            pids = self.pids()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            give_up = time.monotonic() + wait
            while self.pids() and time.monotonic() < give_up:
                time.sleep(0.1)
            if not self.pids():
                return


def shared_folder(prefix: str) -> Path:
    """Make a world-writable sticky folder (1777) under the system temp root, like /tmp."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    os.chmod(folder, 0o1777)
    return folder


def _cannot_search(folder: Path) -> bool:
    """Return whether a user who neither owns ``folder`` nor is in its group cannot enter it."""
    return not folder.stat().st_mode & stat.S_IXOTH


def _blocked_folders(paths: Sequence[Path]) -> list[Path]:
    """Return the folders on the way to ``paths`` that others cannot enter, outermost first."""
    blocked: list[Path] = []
    for path in paths:
        for folder in reversed([path, *path.parents]):
            if folder.is_dir() and folder not in blocked and _cannot_search(folder):
                blocked.append(folder)
    return blocked


def _skip_unless_possible() -> None:
    if os.geteuid() != 0:
        pytest.skip("SKIPPED LOUDLY: tests as other Unix users need root (useradd, setpriv)")
    for tool in ("useradd", "userdel", "setpriv"):
        if shutil.which(tool) is None:
            pytest.skip(f"SKIPPED LOUDLY: tests as other Unix users need '{tool}'")


def _setfacl() -> str:
    found = shutil.which("setfacl")
    if found is None:
        from apt_get import apt_install

        why = apt_install(["acl"], timeout=600)
        found = shutil.which("setfacl")
        if found is None:
            pytest.skip(
                "SKIPPED LOUDLY: the interpreter is in a folder other users cannot enter and "
                f"setfacl (Debian package acl) could not be installed: {why}"
            )
    return found


@contextlib.contextmanager
def local_users(count: int) -> Iterator[list[LocalUser]]:
    """Create ``count`` local users able to run this checkout's venv; delete them at the end."""
    _skip_unless_possible()
    sys.path.insert(0, str(Path(__file__).parent))  # apt_get, beside this file
    python = Path(os.path.realpath(sys.executable))
    blocked = _blocked_folders([python, VENV_BIN, ROOT])
    setfacl = _setfacl() if blocked else ""
    users: list[LocalUser] = []
    granted: list[tuple[str, Path]] = []
    try:
        for _ in range(count):
            name = f"{USER_PREFIX}{secrets.token_hex(3)}"
            subprocess.run(
                ["useradd", "-m", "-s", "/bin/sh", name], check=True, capture_output=True
            )
            entry = pwd.getpwnam(name)
            user = LocalUser(name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))
            users.append(user)
            user.tmpdir.mkdir(mode=0o700)
            os.chown(user.tmpdir, user.uid, user.gid)
            for folder in blocked:
                subprocess.run([setfacl, "-m", f"u:{name}:x", str(folder)], check=True)
                granted.append((name, folder))
        probe = users[0].run(
            ["unattended", "--help"], cwd=users[0].home, env=users[0].env(), timeout=120
        )
        if probe.returncode != 0:
            pytest.fail(f"user {users[0].name} cannot run this venv: {probe.stderr[-1000:]}")
        yield users
    finally:
        for user in users:
            user.kill_all()
        for name, folder in granted:
            subprocess.run([setfacl, "-x", f"u:{name}", str(folder)], check=False)
        for user in users:
            subprocess.run(["userdel", "-r", user.name], check=False, capture_output=True)
