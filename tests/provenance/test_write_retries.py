"""A write is tried again on lock contention and on a disk fault, each within its own budget.

``in_transaction`` runs real transactions on a real SQLite file; the work raises the
error SQLite gives for the fault (its message is what the store classifies), the
given number of times, then writes a row.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import OperationalError

from flows._provenance import StorageUnavailable
from flows._provenance._engines import open_engine, resolve
from flows._provenance._writes import StorageRetry, in_transaction


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    engine = open_engine(resolve(tmp_path / "p.db"), read_only=False)
    in_transaction(engine, lambda c: c.execute(text("CREATE TABLE t (x INTEGER)")))
    return engine


class Faulty:
    """Transaction work that fails with ``message`` ``failures`` times, then inserts a row."""

    def __init__(self, message: str, failures: int) -> None:
        self.message = message
        self.failures = failures
        self.calls = 0

    def __call__(self, connection: Connection) -> int:
        self.calls += 1
        if self.calls <= self.failures:
            raise OperationalError("INSERT", {}, sqlite3.OperationalError(self.message))
        connection.execute(text("INSERT INTO t VALUES (1)"))
        return self.calls


def _rows(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(connection.execute(text("SELECT count(*) FROM t")).scalar_one())


class TestInTransaction:
    def test_lock_contention_is_tried_again_until_the_write_goes_through(
        self, engine: Engine
    ) -> None:
        work = Faulty("database is locked", failures=3)
        assert in_transaction(engine, work, StorageRetry(tries=2, first_delay=0.0)) == 4
        assert _rows(engine) == 1

    def test_a_disk_fault_is_tried_its_own_number_of_times_beyond_the_lock_budget(
        self, engine: Engine
    ) -> None:
        # 20 tries (the setting allows 50) is more than the 12 lock-contention tries.
        work = Faulty("database or disk is full", failures=10_000)
        with pytest.raises(StorageUnavailable, match="after 20 tries"):
            in_transaction(engine, work, StorageRetry(tries=20, first_delay=0.0))
        assert work.calls == 20
        assert _rows(engine) == 0

    def test_a_disk_fault_that_clears_leaves_one_row(self, engine: Engine) -> None:
        work = Faulty("attempt to write a readonly database", failures=13)
        assert in_transaction(engine, work, StorageRetry(tries=20, first_delay=0.0)) == 14
        assert _rows(engine) == 1

    def test_with_one_try_a_disk_fault_is_raised_as_sqlite_said_it(self, engine: Engine) -> None:
        work = Faulty("disk I/O error", failures=1)
        with pytest.raises(OperationalError, match="disk I/O error"):
            in_transaction(engine, work, StorageRetry(tries=1, first_delay=0.0))
        assert work.calls == 1

    def test_another_error_is_not_tried_again(self, engine: Engine) -> None:
        work = Faulty("no such table: u", failures=1)
        with pytest.raises(OperationalError, match="no such table"):
            in_transaction(engine, work, StorageRetry(tries=5, first_delay=0.0))
        assert work.calls == 1
