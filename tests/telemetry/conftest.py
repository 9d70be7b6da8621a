"""Fixtures for the telemetry tests: the OTLP receiver and one demo run shipped to it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # importlib mode: make otlp_receiver importable
from otlp_receiver import (  # after the path is set
    ROOT,
    OTLPReceiver,
    serving_receiver,
    site_with_endpoint,
)

CAMPAIGN_SCRIPT = Path(__file__).with_name("campaign_with_telemetry.py")


@pytest.fixture
def otlp_receiver() -> Iterator[OTLPReceiver]:
    """Serve an OTLP/HTTP receiver for one test."""
    with serving_receiver() as receiver:
        yield receiver


def run_demo(directory: Path, site: Path) -> Path:
    """Run the demo campaign in a subprocess (fresh global providers); return its directory."""
    shutil.copytree(ROOT / "examples" / "demo", directory / "demo")
    state = directory / "state"
    spec = directory / "demo" / "campaign.toml"
    done = subprocess.run(
        [sys.executable, str(CAMPAIGN_SCRIPT), str(spec), str(site), str(state)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "completed"
    return state / "campaigns" / "demo"


@dataclass(frozen=True)
class Shipped:
    """What one demo campaign sent to the receiver, and where its state is."""

    receiver: OTLPReceiver
    directory: Path


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> Shipped:
    """Run the demo once against a receiver (about 20 s); share it among a module's tests."""
    tmp_path = tmp_path_factory.mktemp("otlp")
    with serving_receiver() as receiver:
        directory = run_demo(tmp_path, site_with_endpoint(tmp_path, receiver.endpoint))
    return Shipped(receiver, directory)
