"""The "before" side of a benchmark: another version of the code, named so anyone can rerun it.

``--before`` takes a git ref of this repository (a commit, a tag, a branch) or a
directory holding another checkout. A ref is exported with ``git archive`` into a
temporary directory that is removed afterwards, so the figure in the docs names a
commit that is in the history, and the command reproduces it.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def describe(spec: str) -> str:
    """Return how the side is named in the output: the commit a ref resolves to, or the path."""
    if Path(spec).is_dir():
        return f"directory {Path(spec).resolve()}"
    commit = _resolve(spec)
    subject = subprocess.run(
        ["git", "-C", str(REPO), "log", "-1", "--format=%h %s", commit],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return f"commit {subject[:100]}"


def _resolve(ref: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"--before: {ref!r} is neither a directory nor a commit of {REPO}")
    return done.stdout.strip()


@contextlib.contextmanager
def checkout(spec: str) -> Iterator[Path]:
    """Yield a directory with the code of ``spec`` (a directory as is, a ref exported)."""
    if Path(spec).is_dir():
        yield Path(spec).resolve()
        return
    commit = _resolve(spec)
    folder = Path(tempfile.mkdtemp(prefix=f"unattended-before-{commit[:8]}-"))
    try:
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", "--format=tar", commit],
            capture_output=True,
            check=True,
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(folder, filter="data")
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
