"""Show where a notification goes without showing its secret.

Apprise and webhook URLs carry their service's token (``tgram://BOTTOKEN/...``,
``discord://ID/TOKEN``, ``ntfy://TOPIC``). Wherever a URL is shown or recorded (the
run log, the recorded spec, ``inspect`` and the exports) only its scheme and, where it
is a real host, its host appear. A foundation module: the spec, the engine and the
provenance all mask with it, and it imports nothing of the project.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any
from urllib.parse import urlsplit

_HOST = re.compile(r"^(?=.*[A-Za-z])[A-Za-z0-9-]{1,63}(\.[A-Za-z0-9-]{1,63})+$")


def channel_name(url: str) -> str:
    """Return ``scheme://host`` for ``url``, or ``scheme`` where the host is not a host.

    Only a DNS name, an IP address or ``localhost`` is shown as a host: many Apprise
    URLs carry a token where a host would be.
    """
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
    except ValueError:
        return "invalid"
    scheme = parts.scheme.lower() or "invalid"
    if host == "localhost" or _HOST.match(host) or _is_ip(host):
        return f"{scheme}://{host}"
    return scheme


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def notify_secrets_masked(raw: dict[str, Any]) -> dict[str, Any]:
    """Return the raw spec ``raw`` with ``[notify]``'s URLs shown as ``<secret scheme://host>``.

    The raw spec is what the provenance records (and ``inspect``/``export`` show).
    """
    notify = raw.get("notify")
    if not isinstance(notify, dict):
        return raw

    def mask(url: object) -> object:
        return f"<secret {channel_name(url)}>" if isinstance(url, str) else url

    masked = dict(notify)
    if "webhook_url" in masked:
        masked["webhook_url"] = mask(masked["webhook_url"])
    if isinstance(masked.get("urls"), list):
        masked["urls"] = [mask(url) for url in masked["urls"]]
    return {**raw, "notify": masked}
