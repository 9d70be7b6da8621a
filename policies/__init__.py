"""Hard policies after the accept gate, and the campaign's error taxonomy.

Depends on pydantic, the standard library and ``cel`` (common-expression-language) only.
"""

from policies._context import BatchSummary, RoundContext, proposal_key
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

__all__ = [
    "CODES",
    "ApprovalError",
    "ApprovalRejected",
    "ApprovalTimeout",
    "ApproverNotAllowed",
    "BatchSummary",
    "Block",
    "BudgetExceeded",
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
