"""Helpers for the service reliability tests: demo copies and provenance reads."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples" / "demo"


def demo_copy(folder: Path, spec: str, name: str, **settings: str) -> Path:
    """Copy the demo into ``folder`` under campaign ``name``; ``settings`` replace top-level keys.

    A value of ``settings`` is TOML text, e.g. ``rounds="2"``; keys under a table use
    ``table__key`` (``objective__simulation_cost="1.5"``); an empty value drops the key.
    """
    folder.mkdir(parents=True, exist_ok=True)
    for item in EXAMPLES.iterdir():
        if item.is_file():
            shutil.copy(item, folder / item.name)
    path = folder / spec
    lines = path.read_text().splitlines()
    table = ""
    out = []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("["):
            table = stripped.strip("[]") + "__"
        key = stripped.split("=", 1)[0].strip() if "=" in stripped else None
        full = (table + key) if key and table else key
        if key == "name" and not table:
            line = f'name = "{name}"'
        elif full in settings:
            value = settings.pop(full)
            if not value:
                continue  # an empty value drops the key
            line = f"{key} = {value}"
        out.append(line)
    assert not settings, f"keys not found in {spec}: {sorted(settings)}"
    path.write_text("\n".join(out) + "\n")
    return path


def sqlite_rows(database: Path, query: str, *args: Any) -> list[tuple[Any, ...]]:
    """Run a read-only query on a provenance SQLite file."""
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as connection:
        return list(connection.execute(query, args))


def campaign_db(home: Path, name: str) -> Path:
    """Return the SQLite provenance file of campaign ``name`` under state dir ``home``."""
    found = sorted((home / "campaigns" / name).glob("*.db"))
    assert found, f"no provenance database under {home / 'campaigns' / name}"
    return found[0]
