"""Open SQLAlchemy engines on a SQLite file or a PostgreSQL URL.

SQLite is the default: the file is created with mode 0600 (parent directory
created) before SQLAlchemy touches it, runs in WAL mode with foreign keys on,
and every write transaction (:func:`begin_write`) starts with ``BEGIN
IMMEDIATE`` so writers queue on the busy timeout instead of failing on a lock
upgrade half-way through. Readers open the file read-only, so inspecting never
creates or changes files.

Commits are durable: ``synchronous = FULL`` syncs the WAL at every commit, so a
power loss, kernel crash or file-system error right after a commit keeps it.
With ``NORMAL`` (WAL's usual setting) the database stays consistent but the last
commits can vanish: after an ext4 cut, round 0's records were gone and its
verifier and batch ran again. Measured cost: ``benchmarks/durability.py`` and
``docs/reliability-operations.md``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url

from flows._paths import private_dir
from flows._provenance._errors import ProvenanceDatabaseError
from flows._provenance._locations import (
    BUSY_TIMEOUT_MS,
    Location,
    check_sqlite_file,
    read_only_uri,
    sqlite_location,
)
from flows._provenance._rows import json_text

# Execution option marking a transaction that writes (SQLite begins it IMMEDIATE).
WRITE_OPTION = "provenance_write"
# PRAGMA synchronous for writers: FULL makes every commit durable (see the module
# docstring). Read at each new connection; benchmarks/durability.py sets NORMAL
# on one side to measure what FULL costs.
SQLITE_SYNCHRONOUS = "FULL"


def resolve(url_or_path: str | os.PathLike[str]) -> Location:
    """Turn a URL, a ``.db`` file or a directory into a :class:`Location`.

    A directory (or a missing path without a ``.db``/``.sqlite``/``.sqlite3``
    suffix) means ``<dir>/provenance.db``; a string containing ``://`` is a
    SQLAlchemy URL (``postgresql+psycopg://...`` or ``sqlite:///path``).
    """
    text = os.fspath(url_or_path)
    if "://" in text:
        url = make_url(text)
        if url.get_backend_name() == "sqlite":
            if not url.database or url.database == ":memory:":
                raise ProvenanceDatabaseError(
                    "an in-memory SQLite database cannot hold provenance",
                    details={"url": text},
                )
            return resolve(url.database)
        if url.get_backend_name() != "postgresql":
            raise ProvenanceDatabaseError(
                f"unsupported database backend {url.get_backend_name()!r}; "
                "use a SQLite path or a postgresql+psycopg:// URL",
                details={"backend": url.get_backend_name()},
            )
        if url.drivername == "postgresql":
            url = url.set(drivername="postgresql+psycopg")
        return Location(url=url.render_as_string(hide_password=False), path=None)
    return sqlite_location(text)


@contextlib.contextmanager
def begin_write(engine: Engine) -> Iterator[Connection]:
    """Open a connection and a write transaction on it (IMMEDIATE on SQLite)."""
    with engine.connect() as connection:
        connection.execution_options(**{WRITE_OPTION: True})
        with connection.begin():
            yield connection


def _create_private_file(path: Path) -> None:
    private_dir(path.parent)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return  # another process created it first; it set the mode
    os.close(fd)


def _sqlite_engine(url: str, *, read_only: bool) -> Engine:
    engine = create_engine(
        url, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000}, json_serializer=json_text
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control from the sqlite3 module so "begin" below decides.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        if read_only:
            cursor.execute("PRAGMA query_only = ON")
        else:
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute(f"PRAGMA synchronous = {SQLITE_SYNCHRONOUS}")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        # Writers take the write lock up front: a deferred transaction that reads
        # and then writes can hit SQLITE_BUSY that no timeout resolves. Readers stay
        # deferred so they never queue behind (or block) a writer.
        writes = connection.get_execution_options().get(WRITE_OPTION, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if writes else "BEGIN")

    return engine


def open_engine(location: Location, *, read_only: bool) -> Engine:
    """Return an engine for ``location``; create the SQLite file unless ``read_only``."""
    if location.path is None:
        # Every query here is short and indexed; JIT compilation (on by default since
        # PostgreSQL 12) only adds latency when freshly loaded tables have no statistics.
        options = "-c jit=off"
        if read_only:
            options += " -c default_transaction_read_only=on"
        connect_args: dict[str, Any] = {"options": options}
        return create_engine(
            location.url, pool_pre_ping=True, connect_args=connect_args, json_serializer=json_text
        )
    path = location.path
    if read_only:
        return _sqlite_engine(f"sqlite:///{read_only_uri(path)}&uri=true", read_only=True)
    if path.exists():
        if path.is_dir():
            raise ProvenanceDatabaseError(
                f"{path} is a directory, not a database file", details={"path": str(path)}
            )
        check_sqlite_file(path)
    else:
        _create_private_file(path)
    return _sqlite_engine(f"sqlite:///{path}", read_only=False)
