"""Approvers' own logins to the owner's server: made and revoked by the owner, kept only hashed.

Each approver logs in to the server (the UI's login prompt, or ``PREFECT_API_AUTH_STRING``
on the CLI) as ``NAME:SECRET``. ``unattended approvers add NAME`` makes the secret
(256 random bits), shows it to the owner once, and keeps only a salted scrypt hash
in ``<state_dir>/prefect/approver-logins.json`` (0600 in the 0700 ``prefect``
folder, beside the owner's own ``api-auth``). ``remove`` deletes the entry; the
server reads the file again whenever its modification time changes, so both take
effect on the next request without a restart.

The owner's credential stays what it was (``api-auth``): the runner, the flow runs and
the owner's CLI use it. Nothing here imports Prefect.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from flows._paths import read_private_file, write_private_file
from policies import SpecInvalid

LOGINS_FILE: Final = "approver-logins.json"
# scrypt's cost: 16 MiB and ~50 ms a check here; a right login is remembered by the server
# (flows._prefect._identity), so the cost is paid once a login, not once a request.
_SCRYPT = {"n": 2**14, "r": 8, "p": 1}
_SALT_BYTES: Final = 16
_KEY_BYTES: Final = 32
# An approver's name is the name the policies list (and a login's user part: no ':').
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,99}")
# The owner's credential's user part (flows._prefect._server.AUTH_USER) is not an approver.
RESERVED: Final = frozenset({"unattended", "owner"})


def logins_path(prefect_home: Path) -> Path:
    """Return the approvers' login file of the server whose ``PREFECT_HOME`` is ``prefect_home``."""
    return prefect_home / LOGINS_FILE


def check_name(name: str) -> str:
    """Return ``name`` if it can be an approver's login name (``SpecInvalid`` naming the field)."""
    if not _NAME.fullmatch(name) or name in RESERVED:
        raise SpecInvalid(
            f"approver name {name!r} cannot log in: use letters, digits, '.', '_', '-' or '@', "
            f"starting with a letter or digit (and not {', '.join(sorted(RESERVED))})",
            details={"field": "name"},
        )
    return name


def _digest(secret: str, salt: bytes) -> bytes:
    return hashlib.scrypt(
        secret.encode("utf-8"), salt=salt, dklen=_KEY_BYTES, maxmem=64 * 2**20, **_SCRYPT
    )


@dataclass(frozen=True)
class Login:
    """One approver's stored login: the salt and the scrypt hash of the secret, never the secret."""

    name: str
    salt: bytes
    digest: bytes
    created_at: str

    def matches(self, secret: str) -> bool:
        """Return whether ``secret`` is this approver's (slow on purpose: scrypt)."""
        return hmac.compare_digest(_digest(secret, self.salt), self.digest)


class ApproverLogins:
    """The approvers' logins of one server (one state directory)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> dict[str, Login]:
        """Return the logins by name (none when the file does not exist yet).

        Raises:
            PermissionError: Others may read or write the file (``chmod 600`` it).
        """
        try:
            text = read_private_file(self.path)
        except FileNotFoundError:
            return {}
        entries = json.loads(text or "{}")
        return {
            name: Login(
                name,
                base64.b64decode(entry["salt"]),
                base64.b64decode(entry["scrypt"]),
                str(entry.get("created_at", "")),
            )
            for name, entry in entries.items()
        }

    def _write(self, logins: dict[str, Login]) -> None:
        entries = {
            login.name: {
                "salt": base64.b64encode(login.salt).decode(),
                "scrypt": base64.b64encode(login.digest).decode(),
                "created_at": login.created_at,
            }
            for login in sorted(logins.values(), key=lambda item: item.name)
        }
        write_private_file(self.path, json.dumps(entries, indent=1) + "\n")

    def add(self, name: str, *, replace: bool, created_at: str) -> str:
        """Make ``name``'s login and return its secret (show it once; only its hash is kept).

        Raises:
            SpecInvalid: A bad name, or ``name`` has a login already and ``replace`` is off.
        """
        check_name(name)
        logins = self.read()
        if name in logins and not replace:
            raise SpecInvalid(
                f"approver {name!r} has a login already; --replace issues a new secret "
                "(the old one stops working at once)",
                details={"field": "name"},
            )
        secret = secrets.token_urlsafe(32)
        salt = secrets.token_bytes(_SALT_BYTES)
        logins[name] = Login(name, salt, _digest(secret, salt), created_at)
        self._write(logins)
        return secret

    def remove(self, name: str) -> bool:
        """Revoke ``name``'s login; return whether there was one."""
        logins = self.read()
        if logins.pop(name, None) is None:
            return False
        self._write(logins)
        return True
