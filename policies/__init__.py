"""Hard policies after the accept gate, and the campaign's error taxonomy.

Depends on pydantic, the standard library and ``cel`` (common-expression-language) only.
"""

from typing import TYPE_CHECKING

import lazy_loader

if TYPE_CHECKING:
    from policies._context import BatchSummary, CandidateView, RoundContext, proposal_key
    from policies._decision import Decision, Firing
    from policies._errors import (
        CODES,
        ApprovalError,
        ApprovalRejected,
        ApprovalTimeout,
        ApproverNotAllowed,
        BudgetExceeded,
        DeadlineExceeded,
        FallbackUnavailable,
        InternalError,
        NotAcceptedError,
        NotFound,
        PolicyDenied,
        ProviderError,
        SiteInvalid,
        SpecInvalid,
        TaskFailed,
        UnattendedError,
        ValidationFailed,
        VerifierFailed,
        classify,
    )
    from policies._loading import load_policy, policy_from_dict
    from policies._outcomes import (
        Block,
        Continue,
        Escalate,
        Outcome,
        Retry,
        RunStatus,
        Suspend,
        combine,
        run_status,
    )
    from policies._policy import Policy
    from policies._rules import Rule, Severity, SoftBlockMode

# Where each public name lives: loaded on first use (PEP 562). The error classes
# (``policies._errors``) import in milliseconds; the policy engine (pydantic, CEL)
# loads only when a policy is, so the CLI's read commands skip it.
__getattr__, __dir__, _ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "_context": ["BatchSummary", "CandidateView", "RoundContext", "proposal_key"],
        "_decision": ["Decision", "Firing"],
        "_errors": [
            "ApprovalError",
            "ApprovalRejected",
            "ApprovalTimeout",
            "ApproverNotAllowed",
            "BudgetExceeded",
            "CODES",
            "DeadlineExceeded",
            "FallbackUnavailable",
            "InternalError",
            "NotAcceptedError",
            "NotFound",
            "PolicyDenied",
            "ProviderError",
            "SiteInvalid",
            "SpecInvalid",
            "TaskFailed",
            "UnattendedError",
            "ValidationFailed",
            "VerifierFailed",
            "classify",
        ],
        "_loading": ["load_policy", "policy_from_dict"],
        "_outcomes": [
            "Block",
            "Continue",
            "Escalate",
            "Outcome",
            "Retry",
            "RunStatus",
            "Suspend",
            "combine",
            "run_status",
        ],
        "_policy": ["Policy"],
        "_rules": ["Rule", "Severity", "SoftBlockMode"],
    },
)


__all__ = [
    "CODES",
    "ApprovalError",
    "ApprovalRejected",
    "ApprovalTimeout",
    "ApproverNotAllowed",
    "BatchSummary",
    "Block",
    "BudgetExceeded",
    "CandidateView",
    "Continue",
    "DeadlineExceeded",
    "Decision",
    "Escalate",
    "FallbackUnavailable",
    "Firing",
    "InternalError",
    "NotAcceptedError",
    "NotFound",
    "Outcome",
    "Policy",
    "PolicyDenied",
    "ProviderError",
    "Retry",
    "RoundContext",
    "Rule",
    "RunStatus",
    "Severity",
    "SiteInvalid",
    "SoftBlockMode",
    "SpecInvalid",
    "Suspend",
    "TaskFailed",
    "UnattendedError",
    "ValidationFailed",
    "VerifierFailed",
    "classify",
    "combine",
    "load_policy",
    "policy_from_dict",
    "proposal_key",
    "run_status",
]
