"""A stopped campaign's status comes from the error that stopped it; each has one exit code."""

from __future__ import annotations

import pytest

from flows._cli._exit import exit_code_for_status
from flows._engine._round import stop_status
from policies import InternalError, PolicyDenied, ProviderError


class TestStopStatus:
    def test_a_policy_block_stops_the_campaign_blocked(self):
        assert stop_status(PolicyDenied("round 1: blocked by policy")) == "blocked"

    def test_an_escalation_stops_it_escalated_with_the_same_code(self):
        error = PolicyDenied("round 1: escalated", run_status="escalated")
        assert (stop_status(error), error.code) == ("escalated", "policy_denied")

    @pytest.mark.parametrize("error", [InternalError("x"), ProviderError("x")])
    def test_any_other_error_fails_it(self, error):
        assert stop_status(error) == "failed"

    def test_a_pause_status_on_an_error_is_not_a_way_to_stop(self):
        assert stop_status(InternalError("x", run_status="awaiting_approval")) == "failed"


class TestExitCodeForStatus:
    @pytest.mark.parametrize(
        ("status", "code"),
        [
            ("completed", 0),
            ("failed", 1),
            ("blocked", 3),
            ("escalated", 4),
            ("awaiting_approval", 5),
        ],
    )
    def test_each_final_status_has_its_documented_code(self, status, code):
        assert exit_code_for_status(status) == code
