"""The runner's side of `unattended submit`: requests taken, answered, and slow ones logged."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest

from flows._prefect import _submissions
from flows._prefect._submissions import Submitted, spool_dir, take_submissions


def _request(state_dir: Path, name: str) -> None:
    folder = spool_dir(state_dir)
    folder.mkdir(parents=True, exist_ok=True)
    body = {"spec": "/x/c.toml", "site": None, "state_dir": str(state_dir)}
    (folder / f"{name}.request.json").write_text(json.dumps(body), encoding="utf-8")


async def _submitted(spec: str, **_: Any) -> Submitted:
    steps = {"spec and provenance": 0.05, "deployment": 1.5, "run": 0.25}
    return Submitted("c", uuid4(), uuid4(), already_active=False, steps=steps)


def test_every_request_is_answered_and_counted(tmp_path: Path) -> None:
    _request(tmp_path, "a")
    _request(tmp_path, "b")
    assert asyncio.run(take_submissions(tmp_path, _submitted)) == 2
    answers = sorted(p.name for p in spool_dir(tmp_path).iterdir())
    assert answers == ["a.answer.json", "b.answer.json"]
    answer = json.loads((spool_dir(tmp_path) / "a.answer.json").read_text(encoding="utf-8"))
    assert answer["campaign"] == "c"
    assert answer["already_active"] is False


def test_a_slow_submission_is_logged_with_its_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _request(tmp_path, "a")
    with caplog.at_level(logging.WARNING, logger=_submissions.__name__):
        asyncio.run(take_submissions(tmp_path, _submitted))
    assert caplog.records == []  # answered at once: nothing to say
    monkeypatch.setattr(_submissions, "_SLOW_SECONDS", 0.0)
    _request(tmp_path, "b")
    with caplog.at_level(logging.WARNING, logger=_submissions.__name__):
        asyncio.run(take_submissions(tmp_path, _submitted))
    (record,) = caplog.records
    message = record.getMessage()
    assert message.startswith("runner: slow submission (c): taken ")
    assert "(spec and provenance 0.05 s, deployment 1.50 s, run 0.25 s)" in message
