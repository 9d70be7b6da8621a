"""Where unattended keeps its state on the login node, and how its files are made private.

Everything written under the state directory (``$UNATTENDED_HOME``, default
``~/.unattended``) is private to its owner on a shared login node: directories
0700, files 0600, whatever the umask. The helpers here set those modes at
creation, explicitly, rather than trusting the umask; processes that write files
of their own there (the Prefect server, the runner and its flow runs) also run
under :data:`PRIVATE_UMASK`.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Final

PRIVATE_DIR_MODE: Final = 0o700
PRIVATE_FILE_MODE: Final = 0o600
# For processes whose files we do not create ourselves (the Prefect server, the runner).
PRIVATE_UMASK: Final = 0o077
# The variable ``Settings.home`` reads (a test pins the two together). Read here
# directly: resolving the state directory must not load pydantic, so the read-only
# commands (``inspect``, ``export``) start fast; the other settings are checked where
# they are used.
HOME_VARIABLE: Final = "UNATTENDED_HOME"


def state_dir_from(explicit: str | Path | None, env: Mapping[str, str]) -> Path:
    """Return the state directory: ``explicit``, ``$UNATTENDED_HOME``, or ``~/.unattended``."""
    if explicit:
        return Path(explicit).expanduser().resolve()
    home = env.get(HOME_VARIABLE)
    if home:  # empty counts as unset, as in Settings
        return Path(home).expanduser().resolve()
    return (Path(env.get("HOME") or Path.home()) / ".unattended").resolve()


# ``-s``: no user site; ``-P``: neither the script's folder nor the working folder goes on
# ``sys.path`` (``python -m`` puts the folder it was started from first: a shared folder
# another user planted ``flows/`` in). Not ``-I``: it also drops ``PYTHONPATH``, which is
# how a login node's module-loaded Python (and the benchmarks' before/after) finds the
# code; the environment is the caller's own choice, a folder is not. Children inherit
# both flags (multiprocessing passes them on), and start from a private folder
# (``runner_dir``), so an empty ``PYTHONPATH`` entry names nobody else's folder either.
ISOLATED_PYTHON_FLAGS: Final = ("-s", "-P")


def python_argv(*args: str) -> list[str]:
    """Return the argv that runs this interpreter on ``args`` apart from the caller's folder."""
    return [sys.executable, *ISOLATED_PYTHON_FLAGS, *args]


def runner_dir(state_dir: Path) -> Path:
    """Return the runner's private working folder (0700), made if missing.

    The runner and every process it starts (flow runs, their forkserver, Prefect's
    ``python -m prefect.engine``, simulations) work from here, never from the folder
    ``unattended`` was started in; Prefect's runner keeps its ``storage`` here too,
    not in ``$TMPDIR/runner_storage``, which the first user of a login node owns.
    """
    return private_dir(state_dir / "runner")


def campaign_dir(state_dir: Path, name: str) -> Path:
    """Return the campaign's directory (provenance database, telemetry, logs)."""
    return state_dir / "campaigns" / name


def private_dir(path: Path) -> Path:
    """Create ``path`` and its missing parents, each 0700 whatever the umask; return it.

    Folders that exist already keep their mode: the user may have chosen it.
    """
    missing = []
    folder = path
    while not folder.exists():
        missing.append(folder)
        if folder.parent == folder:
            break
        folder = folder.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=PRIVATE_DIR_MODE)
        except FileExistsError:
            continue  # another process made it first, with its own mode
        os.chmod(folder, PRIVATE_DIR_MODE)  # mkdir's mode is masked by the umask
    return path


def open_private(path: Path, flags: int) -> int:
    """Open (creating if needed) ``path`` as a 0600 file in a private folder; return the fd.

    The mode is set on the open descriptor, so a file made by an older version (or
    under a loose umask) is tightened too.
    """
    private_dir(path.parent)
    descriptor = os.open(path, flags | os.O_CREAT, PRIVATE_FILE_MODE)
    os.fchmod(descriptor, PRIVATE_FILE_MODE)
    return descriptor


def append_private(path: Path) -> int:
    """Open ``path`` for appending as a private file; return the descriptor."""
    return open_private(path, os.O_WRONLY | os.O_APPEND)


def write_private(path: Path, text: str) -> None:
    """Replace ``path``'s content with ``text``, as a private file."""
    descriptor = open_private(path, os.O_WRONLY | os.O_TRUNC)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(text)


def file_problem(path: Path, *, max_bytes: int | None = None) -> str | None:
    """Return why ``path`` is not a readable regular file ("no such file", ...), or None.

    Checked before reading, so a directory or a device (``/dev/zero`` would be read
    forever), a symlink loop, a file this user may not read, or one over
    ``max_bytes`` is named for what it is.
    """
    try:
        status = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return "no such file"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "is a symlink loop"
        if exc.errno == errno.EACCES:
            return "cannot be read (permission denied)"
        return f"cannot read the file ({type(exc).__name__})"
    if stat.S_ISDIR(status.st_mode):
        return "is a directory, not a file"
    if not stat.S_ISREG(status.st_mode):
        return "is not a regular file"
    if not os.access(path, os.R_OK):
        return "cannot be read (permission denied)"
    if max_bytes is not None and status.st_size > max_bytes:
        return f"is too large ({status.st_size} bytes; at most {max_bytes} are read)"
    return None


def absolute(path: Path) -> Path:
    """Return ``path`` made absolute with symlinks resolved, never raising on a loop.

    ``Path.resolve`` raises RuntimeError on a symlink loop (Python 3.11);
    ``os.path.realpath`` returns the path, whose ``stat`` then says ELOOP
    (:func:`file_problem`: "is a symlink loop").
    """
    return Path(os.path.realpath(path.expanduser()))


def approvers_dir(state_dir: Path) -> Path:
    """Return the folder of the enrolled approvers' one-time-code secrets (0700)."""
    return state_dir / "approvers"


def write_private_file(path: Path, text: str) -> None:
    """Write a secret to ``path`` as a private file, atomically (no half-written secret).

    The text goes to a private partial file first, fsynced, then renamed over ``path``.
    """
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    descriptor = open_private(partial, os.O_WRONLY | os.O_TRUNC)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)


def read_private_file(path: Path) -> str:
    """Return the text of a secret file, refusing one that others can read or write.

    Raises:
        PermissionError: The file's mode lets its group or others in (fix: chmod 600).
    """
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise PermissionError(
            f"{path} is readable or writable by other users (mode {mode:o}); run 'chmod 600 {path}'"
        )
    return path.read_text(encoding="utf-8").strip()
