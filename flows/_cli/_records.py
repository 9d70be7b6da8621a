"""Open a provenance database for the read-only commands, and write ``export``'s records.

Imports no rich (``export`` prints no table) and, for a SQLite file, no SQLAlchemy:
:func:`open_read_only` hands out the standard-library reader
(``flows/_provenance/_sqlite.py``); a URL opens the full store. ``--format ro-crate``
and ``prov`` (:func:`export_graph`) open the full store, read-only: the crate holds the
HTML report, which reads through it.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from flows._provenance import _export
from flows._provenance._readers import StoreReads
from flows._provenance._sqlite import open_read_only as _open


@contextlib.contextmanager
def open_read_only(location: str) -> Iterator[Any]:
    """Open the store at ``location`` read-only and close it afterwards.

    A SQLite file is read with the standard library (no SQLAlchemy); a URL opens
    the full store. Either has the readers of :class:`StoreReads`.
    """
    store: Any = _open(location)
    try:
        yield store
    finally:
        store.close()


def _csv_value(value: Any) -> Any:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return json.dumps(value, separators=(",", ":"), default=str)


def _write(records: Iterator[dict[str, Any]], fmt: str, out: TextIO) -> None:
    if fmt == "jsonl":
        for record in records:
            out.write(json.dumps(record, separators=(",", ":"), default=str) + "\n")
        return
    writer: csv.DictWriter[str] | None = None
    for record in records:
        if writer is None:
            writer = csv.DictWriter(out, fieldnames=list(record), lineterminator="\n")
            writer.writeheader()
        writer.writerow({k: _csv_value(v) for k, v in record.items()})


def export(store: StoreReads, name: str, *, fmt: str, records: str, output: str | None) -> None:
    """Write campaign ``name``'s records; a file appears whole or not at all."""
    export_records = {
        "all": _export.export_records,
        "attempts": _export.export_attempts,
        "task_results": _export.export_task_results,
        "allocations": _export.export_allocations,
    }[records]
    with store.reading() as reader:
        stream = export_records(reader, name)
        # Raises NotFound before any file is created. A campaign with no such records
        # (no allocations on a site without batch jobs) gets empty output, not a traceback.
        first = next(stream, None)
        chained = iter(()) if first is None else _chain(first, stream)
        if output is None:
            _write(chained, fmt, sys.stdout)
            return
        target = Path(output)
        fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or ".")
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
                _write(chained, fmt, handle)
            os.replace(temp, target)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest


def export_graph(location: str, name: str, *, fmt: str, output: str | None) -> int:
    """Write campaign ``name`` as a Provenance Run Crate or as W3C PROV; return the exit code.

    ``ro-crate``: the folder ``output`` (default ``./NAME-ro-crate``) or, for a path
    ending ``.zip``, a zip file. ``prov``: ``OUT.prov.json`` and ``OUT.provn`` for
    ``--out OUT`` (default ``./NAME``). Either appears whole or not at all; an unknown
    campaign writes nothing. Prints what was written, one path a line.
    """
    from flows._provenance import ProvenanceStore

    store = ProvenanceStore.open(location, read_only=True)
    try:
        if fmt == "ro-crate":
            from flows._crate import write_crate

            target = Path(output or f"{name}-ro-crate").expanduser()
            try:
                written = [write_crate(store, name, target)]
            except FileExistsError as exc:  # exit 2: the user named a path that is taken
                from policies import ValidationFailed

                raise ValidationFailed(str(exc), details={"field": "--output"}) from exc
        else:
            written = _write_prov(store, name, Path(output or name).expanduser())
    finally:
        store.close()
    for path in written:
        print(path)
    return 0


def _write_prov(store: Any, name: str, target: Path) -> list[Path]:
    from flows._provenance._prov import provjson_name, provn_name, write_prov
    from flows._provenance._run_graph import campaign_graph

    paths = [provjson_name(target), provn_name(target)]
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    temporary = [p.with_name(f".{p.name}.{os.getpid()}.part") for p in paths]
    try:
        with store.reading() as reader:
            items = campaign_graph(reader, name)
            first = next(items)  # NotFound before any file is created
            write_prov(_chain(first, items), temporary[1], temporary[0])
        for part, path in zip(temporary, paths, strict=True):
            os.replace(part, path)
    finally:
        for part in temporary:
            part.unlink(missing_ok=True)
    return paths
