"""``unattended status NAME`` takes a campaign name as well as a flow run id.

A name shows the campaign's newest run (tested through the real command line with a
server in ``tests/reliability/crash/test_cancel.py``); an unknown one is one line
and exit 2, without asking any server.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from flows._cli import main


def test_an_unknown_campaign_name_is_bad_input_naming_the_state_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("UNATTENDED_HOME", str(tmp_path))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)

    assert main(["status", "no-such-campaign"]) == 2

    err = capsys.readouterr().err
    assert err.startswith(
        "error: 'no-such-campaign' is neither a flow run id nor a campaign submitted from "
        f"this state directory ({tmp_path})"
    )
