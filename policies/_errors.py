"""One error taxonomy for the whole campaign, with stable codes.

Every error that crosses a public boundary (the CLI, a run's final state, the
provenance database) is an :class:`UnattendedError`. Its ``code`` is stable and
its ``retryable`` flag is data, not guessed from the class::

    UnattendedError                      code            retryable
    ├── BudgetExceeded                   budget_exceeded     no
    ├── DeadlineExceeded                 deadline_exceeded   no
    ├── PolicyDenied                     policy_denied       no
    ├── ValidationFailed                 validation_failed   no
    ├── NotAcceptedError                 not_accepted        no
    ├── FallbackUnavailable              fallback_unavailable no
    ├── ApprovalError
    │   ├── ApprovalRejected             approval_rejected   no
    │   ├── ApprovalTimeout              approval_timeout    no
    │   └── ApproverNotAllowed           approver_not_allowed no
    ├── VerifierFailed                   verifier_failed     no
    ├── ProviderError                    provider_error      yes
    ├── TaskFailed                       task_failed         per instance
    │   (a task's record carries ``bad_output`` when it ran but wrote no value the
    │   campaign reads: stdout not JSON, or no finite number where the objective reads one)
    ├── SpecInvalid                      spec_invalid        no
    │   └── SiteInvalid                  site_invalid        no
    ├── NotFound                         not_found           no
    └── InternalError                    internal            no

An error that stops a campaign on purpose also says how the run ends:
``run_status`` is ``"blocked"`` for ``PolicyDenied``, ``BudgetExceeded``,
``ApprovalRejected`` and ``ApprovalTimeout``, ``"escalated"`` when the raiser
says so (a policy's ``Escalate``), and ``None`` for every other error (the run
``failed``). Like ``code`` and ``retryable`` it is data, settable per instance.

Five codes are raised by ``flows`` (its campaign-level errors build on this base):
``spec_changed`` (an input named by the spec differs from the pinned one),
``decision_mismatch`` (a replayed round derives another decision than the recorded
one), ``fenced_out`` (another run holds the campaign's lease),
``storage_unavailable`` (disk full, read-only directory, database locked; retryable)
and ``continuations_exhausted`` (the runner's watchdog continued the campaign's
crashed or failed runs as often as it may without progress, and stopped it).

Messages and ``details`` name fields, rules, codes and ids. They never carry a
proposal's content, a prompt, or a secret: callers pass identifiers, and
:func:`classify` never copies the text of a foreign exception.
"""

# The taxonomy names outcomes (BudgetExceeded, NotFound), a stable public API; no Error suffix.
# ruff: noqa: N818

from __future__ import annotations

import errno
from collections.abc import Mapping
from typing import Any, ClassVar, Final

from policies._outcomes import RunStatus

CODES: Final[tuple[str, ...]] = (
    "approval_rejected",
    "approval_timeout",
    "approver_not_allowed",
    "bad_output",
    "budget_exceeded",
    "continuations_exhausted",
    "deadline_exceeded",
    "decision_mismatch",
    "fallback_unavailable",
    "fenced_out",
    "internal",
    "not_accepted",
    "not_found",
    "policy_denied",
    "provider_error",
    "site_invalid",
    "spec_changed",
    "spec_invalid",
    "storage_unavailable",
    "task_failed",
    "validation_failed",
    "verifier_failed",
)


class UnattendedError(Exception):
    """Base of every error the campaign reports, with a stable ``code``.

    Args:
        message: What happened, naming fields, rules, codes and ids only.
        code: Overrides the class's code (must be one of :data:`CODES`).
        retryable: Overrides the class's default.
        details: JSON-serialisable identifiers (field, rule, round, run id, ...).
        run_status: How a campaign stopped by this error ends; overrides the class's
            default (``None``: the run failed).
    """

    code: ClassVar[str] = "internal"
    default_retryable: ClassVar[bool] = False
    default_run_status: ClassVar[RunStatus | None] = None

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        retryable: bool | None = None,
        details: Mapping[str, Any] | None = None,
        run_status: RunStatus | None = None,
    ) -> None:
        super().__init__(message)
        if code is not None:
            if code not in CODES:
                raise ValueError(f"unknown error code {code!r}")
            self.code = code  # type: ignore[misc]  # an instance may carry a narrower code
        self.message = message
        self.retryable = self.default_retryable if retryable is None else retryable
        self.details: dict[str, Any] = dict(details or {})
        self.run_status = self.default_run_status if run_status is None else run_status

    def to_dict(self) -> dict[str, Any]:
        """Return the error as JSON-ready data: code, type, message, retryable, details."""
        return {
            "code": self.code,
            "type": type(self).__name__,
            "message": self.message,
            "retryable": self.retryable,
            "details": self.details,
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"


class BudgetExceeded(UnattendedError):
    """The campaign's node-hour or round budget would be exceeded."""

    code = "budget_exceeded"
    default_run_status = "blocked"


class DeadlineExceeded(UnattendedError):
    """A deadline (allocation walltime, task timeout) passed."""

    code = "deadline_exceeded"


class PolicyDenied(UnattendedError):
    """A hard policy refused the round."""

    code = "policy_denied"
    default_run_status = "blocked"


class ValidationFailed(UnattendedError):
    """A value failed validation where no re-ask is possible."""

    code = "validation_failed"


class NotAcceptedError(UnattendedError):
    """No proposal passed the gate and there was no fallback."""

    code = "not_accepted"


class FallbackUnavailable(UnattendedError):
    """The deterministic fallback could not be built: nothing may run."""

    code = "fallback_unavailable"


class ApprovalError(UnattendedError):
    """Base of the approval outcomes that stop or re-suspend a round."""

    code = "approval_rejected"


class ApprovalRejected(ApprovalError):
    """An allowed approver rejected the request."""

    code = "approval_rejected"
    default_run_status = "blocked"


class ApprovalTimeout(ApprovalError):
    """Nobody answered the approval request in time."""

    code = "approval_timeout"
    default_run_status = "blocked"


class ApproverNotAllowed(ApprovalError):
    """Someone not among the rule's approvers tried to decide."""

    code = "approver_not_allowed"


class VerifierFailed(UnattendedError):
    """A verifier task failed (as opposed to rejecting a proposal)."""

    code = "verifier_failed"


class ProviderError(UnattendedError):
    """A model endpoint or another upstream service failed."""

    code = "provider_error"
    default_retryable = True


class TaskFailed(UnattendedError):
    """A task on the allocation failed; ``retryable`` says if it was transient."""

    code = "task_failed"


class SpecInvalid(UnattendedError):
    """A campaign spec or policy file is invalid (a load-time error)."""

    code = "spec_invalid"


class SiteInvalid(SpecInvalid):
    """A site config is invalid (a load-time error)."""

    code = "site_invalid"


class NotFound(UnattendedError):
    """An unknown campaign, round, run or approval."""

    code = "not_found"


class InternalError(UnattendedError):
    """Anything unexpected."""

    code = "internal"


_STORAGE_ERRNOS: Final = frozenset({errno.ENOSPC, errno.EROFS, errno.EDQUOT})


def classify(exc: BaseException) -> UnattendedError:
    """Map any exception onto the taxonomy, defaulting to ``internal``.

    The foreign exception's message is not copied (it may hold proposal content
    or a secret); only its type name goes into ``details``.
    """
    if isinstance(exc, UnattendedError):
        return exc
    name = type(exc).__name__
    module = type(exc).__module__
    if module.startswith("acceptance") and name == "NotAccepted":
        attempts = getattr(exc, "attempts", ())
        return NotAcceptedError(
            f"no proposal passed the gate in {len(attempts)} attempt(s)",
            details={"attempts": len(attempts), "cause": name},
        )
    if name == "ValidationError" and module.startswith("pydantic"):
        fields = []
        errors = getattr(exc, "errors", None)
        if callable(errors):
            fields = [".".join(str(p) for p in e.get("loc", ())) for e in errors()]
        return ValidationFailed(
            "validation failed for " + (", ".join(fields) or "the value"),
            details={"fields": fields, "cause": name},
        )
    if isinstance(exc, TimeoutError):
        return DeadlineExceeded("an operation timed out", details={"cause": name})
    if isinstance(exc, OSError) and exc.errno in _STORAGE_ERRNOS:
        # A full disk or a read-only directory: the same campaign can go on once it clears.
        return UnattendedError(
            f"the file system refused a write ({errno.errorcode[exc.errno]})",
            code="storage_unavailable",
            retryable=True,
            details={"cause": name, "errno": errno.errorcode[exc.errno]},
        )
    return InternalError(f"unexpected {name}", details={"cause": name})
