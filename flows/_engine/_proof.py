"""Per-approver one-time codes (RFC 6238 TOTP): enrol an approver, verify a code, refuse a replay.

Each approver has a random 160-bit secret in ``<state_dir>/approvers/<name>.totp``
(mode 0600, folder 0700), shown once at enrolment as an ``otpauth://`` URI for an
authenticator app. The flow, running as the campaign's owner, reads it to check a
code. A TOTP secret cannot be stored hashed: checking a code needs the key itself
(HMAC), so the protection is the file's owner-only mode.

A code is accepted for the current 30 s step and one step either side (clock
skew). The last step each approver used is kept beside the secret
(``<name>.used``, under an exclusive lock), and a code of that step or an earlier
one is refused: a code seen once (over a shoulder, in a log) cannot be used again.

Nothing here imports Prefect; ``pyotp`` does the RFC 6238 arithmetic.
"""

from __future__ import annotations

import contextlib
import fcntl
import hmac
import os
import re
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Final, Literal, TextIO

import pyotp

from flows._paths import read_private_file, write_private_file
from policies import SpecInvalid

Proof = Literal[
    "totp ok",
    "totp failed",
    "totp replayed",
    "totp missing",
    "totp not enrolled",
    "totp secret exposed",
]

ISSUER: Final = "unattended"
# Approver names become file names: no separators, no dot files.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,99}")
_CODE = re.compile(r"[0-9]{6}")  # ASCII digits only: \d matches any script's digits
_SKEW_STEPS: Final = 1


class ApproverCodes:
    """The enrolled approvers' TOTP secrets under one folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def secret_path(self, name: str) -> Path:
        """Return the 0600 file holding ``name``'s secret (``SpecInvalid`` for a bad name)."""
        if not _NAME.fullmatch(name):
            raise SpecInvalid(
                f"approver name {name!r} cannot be enrolled: use letters, digits, '.', '_', "
                "'-' or '@', starting with a letter or digit",
                details={"field": "name"},
            )
        return self.folder / f"{name}.totp"

    def enrolled(self, name: str) -> bool:
        """Return whether ``name`` has a secret."""
        return self.secret_path(name).exists()

    def enroll(self, name: str, *, replace: bool = False) -> str:
        """Create ``name``'s secret and return its ``otpauth://`` URI (show it once).

        Raises:
            SpecInvalid: The name is not a safe file name, or it is enrolled already
                and ``replace`` is off.
        """
        path = self.secret_path(name)
        if path.exists() and not replace:
            raise SpecInvalid(
                f"approver {name!r} is enrolled already; --replace issues a new secret "
                "(the old code stops working)",
                details={"field": "name"},
            )
        secret = pyotp.random_base32(32)  # 160 bits, RFC 4226's recommended key length
        write_private_file(path, secret + "\n")
        self._used_path(name).unlink(missing_ok=True)
        return pyotp.TOTP(secret).provisioning_uri(name=name, issuer_name=ISSUER)

    def verify(self, name: str, code: str, now: datetime) -> Proof:
        """Return how ``code`` proves ``name`` at ``now``: ok, failed, replayed, missing."""
        code = code.strip().replace(" ", "")
        if not code:
            return "totp missing"
        try:
            path = self.secret_path(name)
            secret = read_private_file(path)
        except (SpecInvalid, FileNotFoundError):
            return "totp not enrolled"
        except PermissionError:
            # Others could read the secret, so they could make the code: it proves nothing.
            return "totp secret exposed"
        # A malformed code is compared anyway (and fails): no early answer to time.
        totp = pyotp.TOTP(secret)
        step = totp.timecode(now)
        matched = None
        for offset in range(-_SKEW_STEPS, _SKEW_STEPS + 1):
            expected = totp.at(now, counter_offset=offset)
            # As bytes: compare_digest refuses str with non-ASCII characters (an answer may
            # hold any Unicode, e.g. digits of another script, and must fail, not crash).
            if hmac.compare_digest(expected.encode(), code.encode()) and _CODE.fullmatch(code):
                matched = step + offset
        if matched is None:
            return "totp failed"
        with self._locked_used(name) as used:
            last = used.read().strip()
            if last.isdigit() and matched <= int(last):
                return "totp replayed"
            used.seek(0)
            used.truncate()
            used.write(str(matched))
        return "totp ok"

    def _used_path(self, name: str) -> Path:
        return self.folder / f"{name}.used"

    @contextlib.contextmanager
    def _locked_used(self, name: str) -> Iterator[TextIO]:
        path = self._used_path(name)
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        with os.fdopen(descriptor, "r+", encoding="utf-8") as handle:
            # Two campaigns checking the same approver's code at once: one wins the step.
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield handle
                handle.flush()
                os.fsync(handle.fileno())
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
