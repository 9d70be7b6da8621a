"""Where unattended keeps its state on the login node."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def state_dir_from(explicit: str | Path | None, env: Mapping[str, str]) -> Path:
    """Return the state directory: ``explicit``, ``$UNATTENDED_HOME``, or ``~/.unattended``."""
    if explicit:
        return Path(explicit).expanduser().resolve()
    if env.get("UNATTENDED_HOME"):
        return Path(env["UNATTENDED_HOME"]).expanduser().resolve()
    return (Path(env.get("HOME") or Path.home()) / ".unattended").resolve()


def campaign_dir(state_dir: Path, name: str) -> Path:
    """Return the campaign's directory (provenance database, telemetry, logs)."""
    return state_dir / "campaigns" / name
