"""The accept gate: ask a producer, check the value, re-ask within a budget, fall back.

Depends on pydantic and the OpenTelemetry API only.
"""

from acceptance._gate import accept
from acceptance._types import Attempt, Disposition, NotAccepted, Outcome, Rejected, Verdict

__all__ = ["Attempt", "Disposition", "NotAccepted", "Outcome", "Rejected", "Verdict", "accept"]
