"""``approve``: answer a run's approval request, then report what the flow made of it.

The server only checks the form (``flows._prefect._rest``, no Prefect import); the
flow judges the answer (approver, deadline, proof) when the run resumes and records
its verdict in the provenance, which this reads back. A verdict that is not an
approval is raised, never printed here: ``AnswerRefusedError`` (exit 6) when the flow
refused the answer, ``NoVerdictError`` (exit 1, or 2 when the run's inputs changed) when
nothing judged it, ``RunnerError`` (exit 1) when no runner is there to judge it.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING
from uuid import UUID

from flows._cli._exit import EXIT_ANSWER_REFUSED, CommandError
from flows._cli._runner import RunnerError, nudge, runner_alive
from flows._cli._runs import parse_run_id, recorded_ending, registered
from flows._paths import state_dir_from
from flows._prefect._connect import connect
from policies import NotFound, UnattendedError

if TYPE_CHECKING:
    from flows._prefect._pending import PendingApproval
    from flows._prefect._rest import RunView
    from flows._provenance import ApprovalEventRecord


class AnswerRefusedError(CommandError):
    """The flow refused the answer (approver, deadline, override, proof); the run waits again."""

    def __init__(self, message: str, *, code: str, refusal: str) -> None:
        super().__init__(
            message, exit_code=EXIT_ANSWER_REFUSED, code=code, details={"refusal": refusal}
        )


class NoVerdictError(UnattendedError):
    """Nothing judged the answer: the run ended first, or the wait ran out.

    The answer is on the server; the exit status follows ``code`` (``spec_changed``: 2).
    """

    code = "internal"


_VERDICT_POLL_SECONDS = 0.5


def answer(
    run: str,
    approver: str,
    *,
    reject: bool,
    comment: str,
    batch_size: int | None,
    wait_seconds: float | None,
    code: str | None = None,
    candidates: list[int] | None = None,
) -> int:
    """Answer a run's approval request through the resume API, then report the flow's verdict.

    The server only checks the form; the flow judges the answer (approver, deadline,
    proof) when the run resumes. Unless ``wait_seconds`` is None this waits that long
    for the verdict the flow records and raises ``AnswerRefusedError`` (exit 6) if it refused.
    """
    connect(start=False)
    from flows._prefect import _rest as rest

    flow_run_id = parse_run_id(run)
    found = rest.read_run(os.environ, flow_run_id)
    if not found.paused:
        raise NotFound(f"flow run {flow_run_id} is not waiting for approval", details={"run": run})
    pending: PendingApproval | None = None
    if wait_seconds is not None:
        from flows._prefect._pending import describe_pending

        # Before resuming: the form's pause key is the handle on the flow's verdict.
        parameters = registered(found)
        if parameters is None:
            raise NotFound(
                f"flow run {flow_run_id} is not a campaign of this state directory "
                f"({state_dir_from(None, os.environ)}); answer it from the Prefect UI, or "
                "with --no-wait (its verdict is recorded in its owner's provenance)",
                details={"run": run},
            )
        pending = describe_pending(parameters, found.pause_key, os.environ)
    rest.approve(
        os.environ,
        flow_run_id,
        approver=approver,
        reject=reject,
        comment=comment,
        batch_size=batch_size,
        code=code,
        candidates=candidates,
    )
    nudge()
    if pending is None or wait_seconds is None:
        print(
            f"answer sent; the flow judges it when the run resumes "
            f"(see 'unattended status {flow_run_id}')"
        )
        return 0
    if not runner_alive():
        raise RunnerError(
            "answer sent, but no runner serves this state directory, so nothing judges it "
            f"yet: 'unattended serve --detach' starts one ('unattended status {flow_run_id}' "
            "shows the run)",
            details={"run": str(flow_run_id)},
        )
    print("answer sent; waiting for the flow's verdict ...", flush=True)
    event, ended = _await_verdict(pending, wait_seconds, flow_run_id)
    if event is None and ended is not None:
        # The run ended before judging the answer (its inputs changed since it was pinned,
        # say): the answer was not judged, and the run's recorded ending says why.
        ending = recorded_ending(ended)
        changed = ending is not None and ending.code == "spec_changed"
        raise NoVerdictError(
            f"no verdict: the run ended {ended.state_name} before judging the answer"
            + (f" ({ending.status}, {ending.code})" if ending is not None else "")
            + (f": {ended.state_message}" if ended.state_message else "")
            + f" ('unattended status {flow_run_id}' shows the run)",
            code="spec_changed" if changed else None,
            details={"run": str(flow_run_id), "state": ended.state_name},
        )
    if event is None:
        raise NoVerdictError(
            f"no verdict from the flow within {wait_seconds:g} s; the answer is on the server and "
            f"is judged when a runner resumes the run ('unattended serve --detach' starts one; "
            f"'unattended status {flow_run_id}' shows the run)",
            code="deadline_exceeded",
            details={"run": str(flow_run_id), "seconds": wait_seconds},
        )
    return _report_verdict(event, pending)


# States a run leaves an answer unjudged in: it will not judge it any more.
_ENDED_STATES = frozenset({"FAILED", "CRASHED", "CANCELLED", "COMPLETED"})


def _await_verdict(
    pending: PendingApproval, wait_seconds: float, flow_run_id: UUID
) -> tuple[ApprovalEventRecord | None, RunView | None]:
    """Wait for the flow's verdict on the answer; also return the run if it ended without one."""
    from flows._prefect import _rest as rest
    from flows._prefect._pending import answer_event

    deadline = time.monotonic() + wait_seconds
    while True:
        event = answer_event(pending)
        if event is not None or time.monotonic() >= deadline:
            return event, None
        run = rest.read_run(os.environ, flow_run_id)
        if run.state_type in _ENDED_STATES:
            return answer_event(pending), run  # a verdict recorded just before the end counts
        time.sleep(_VERDICT_POLL_SECONDS)


def _report_verdict(event: ApprovalEventRecord, pending: PendingApproval) -> int:
    """Print what the flow made of an accepted answer and return 0; raise if it refused it.

    Raises:
        AnswerRefusedError: The flow refused the answer (exit 6), saying why.
    """
    by = event.decided_by or "?"
    if event.decision == "approved":
        overrides = event.overrides if isinstance(event.overrides, dict) else {}
        size = overrides.get("batch_size")
        subset = overrides.get("candidates")
        part = (
            f"candidates {', '.join(map(str, subset))} (the others are struck)"
            if subset
            else f"its first {size} candidates"
            if size
            else "the proposed batch"
        )
        print(f"approved by {by}: the flow accepted the answer and runs {part}")
        return 0
    if event.decision == "rejected":
        print(
            f"rejected by {by}: the flow accepted the answer; the campaign stops "
            "(blocked, approval_rejected)"
        )
        return 0
    if event.decision == "timeout":
        deadline = pending.deadline.isoformat(timespec="seconds") if pending.deadline else "?"
        then = (
            "it runs the deterministic fallback batch"
            if pending.on_timeout == "fallback"
            else "it stopped (blocked, approval_timeout)"
        )
        raise AnswerRefusedError(
            f"refused: the answer arrived after the deadline ({deadline}); the campaign follows "
            f"its timeout policy: {then}",
            code="approval_timeout",
            refusal="timeout",
        )
    if event.refusal is not None:
        why = {
            "override_not_allowed": "this rule allows no override (max_batch_override = false); "
            "approve the whole batch, or reject",
            "override_ambiguous": "an answer gives a batch size or candidates, not both",
            "override_out_of_range": "the override names candidates the batch does not have",
            "unreadable": "the answer could not be read as the form's",
        }.get(event.refusal, event.refusal)
        raise AnswerRefusedError(
            f"refused: {why}; nothing ran and the run waits again",
            code="validation_failed",
            refusal=event.refusal,
        )
    if event.proof is not None:
        why = {
            "totp failed": "the one-time code was wrong (or from another 30 s window)",
            "totp replayed": "the one-time code was used already; wait for the next one",
            "totp missing": "this rule requires your one-time code (--code)",
            "totp not enrolled": f"{by!r} has no one-time code enrolled on this node "
            "('unattended approvers code NAME')",
            "totp secret exposed": f"{by!r}'s secret file is readable by other users, so a "
            "code proves nothing; re-enrol with 'unattended approvers code NAME --replace'",
        }.get(event.proof, event.proof)
        raise AnswerRefusedError(
            f"refused: {why}; nothing ran and the run waits again for an answer with proof",
            code="validation_failed",
            refusal=event.proof,
        )
    allowed = ", ".join(pending.approvers) or "-"
    raise AnswerRefusedError(
        f"refused: {by!r} is not an allowed approver of rule {pending.rule} (allowed: {allowed}); "
        "nothing ran and the run waits again for an allowed approver",
        code="approver_not_allowed",
        refusal="approver_not_allowed",
    )
