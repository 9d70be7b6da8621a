"""Exit codes: the one place where an error or a campaign status becomes an exit status.

Every command's handler raises; :func:`flows._cli.main` catches once and calls
:func:`report_error`, which prints one ``error: ...`` line on stderr (one per problem
for :class:`ProblemsFoundError`) and returns :func:`exit_code_for`. An error of the
taxonomy gets its status from its ``code``; an outcome the codes do not decide (an
approval answer the flow refused) is a :class:`CommandError` carrying its
``exit_code``. The table:

====  =====================================================================
code  meaning
====  =====================================================================
0     completed (or the command did what it was asked)
1     failed: the campaign failed, or a service error (server, database)
2     bad input: spec, site, policy, form, unknown run or campaign, bad file
3     the campaign is blocked by a policy
4     the campaign escalated
5     the campaign waits for approval (``--no-wait``)
6     an approval answer was refused by the flow (not an allowed approver,
      expired, proof failed)
====  =====================================================================
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, assert_never

from flows._words import count
from policies import UnattendedError

if TYPE_CHECKING:  # the store's package loads SQLAlchemy; `inspect --help` must not
    from flows._provenance import CampaignStatus

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_BAD_INPUT: Final = 2
EXIT_BLOCKED: Final = 3
EXIT_ESCALATED: Final = 4
EXIT_AWAITING_APPROVAL: Final = 5
EXIT_ANSWER_REFUSED: Final = 6

# Error codes of the taxonomy that mean "the user gave us something wrong".
BAD_INPUT_CODES: Final = frozenset(
    {"spec_invalid", "site_invalid", "validation_failed", "not_found", "spec_changed"}
)


class CommandError(UnattendedError):
    """An outcome a command ends with as an error, carrying the exit status it exits with.

    For outcomes whose status the table does not derive from ``code``: an approval
    answer the flow refused exits 6 (``flows._cli._answer.AnswerRefusedError``).

    Args:
        message: What happened, naming fields, rules, codes and ids only.
        exit_code: The exit status (the table above).
        code: The error's stable code (one of ``policies.CODES``).
        details: JSON-serialisable identifiers.
    """

    def __init__(
        self,
        message: str,
        *,
        exit_code: int,
        code: str | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message, code=code, details=details)
        self.exit_code = exit_code


class ProblemsFoundError(UnattendedError):
    """Every problem found in one input (``check``): one ``error:`` line each, then how many.

    Args:
        problems: Each problem's text (naming its file and field).
        code: ``spec_invalid`` (the default) or ``site_invalid``; either exits 2.
    """

    code = "spec_invalid"

    def __init__(self, problems: Sequence[str], *, code: str | None = None) -> None:
        super().__init__(
            f"{count(len(problems), 'problem')} found",
            code=code,
            details={"problems": len(problems)},
        )
        self.problems = tuple(problems)


def exit_code_for(exc: BaseException) -> int:
    """Return the exit status for an error that reached the command line."""
    if isinstance(exc, CommandError):
        return exc.exit_code
    if isinstance(exc, UnattendedError):
        return EXIT_BAD_INPUT if exc.code in BAD_INPUT_CODES else EXIT_FAILED
    if isinstance(exc, _NAMED_WRONG_THING) or is_database_error(exc):
        # A file that is missing or unreadable, or a database that is not one:
        # the user named the wrong thing (``--db``, a spec path).
        return EXIT_BAD_INPUT
    return EXIT_FAILED


_NAMED_WRONG_THING: Final = (
    FileNotFoundError,
    IsADirectoryError,
    NotADirectoryError,
    PermissionError,
)


def is_database_error(exc: BaseException) -> bool:
    """Return whether ``exc`` is a database's error (SQLAlchemy's or ``sqlite3``'s).

    Neither module is imported here: an error of one can only come once it is loaded.
    """
    sqlalchemy_exc = sys.modules.get("sqlalchemy.exc")
    if sqlalchemy_exc is not None and isinstance(exc, sqlalchemy_exc.DatabaseError):
        return True
    sqlite3 = sys.modules.get("sqlite3")
    return sqlite3 is not None and isinstance(exc, sqlite3.DatabaseError)


def reaches_the_user(exc: BaseException) -> bool:
    """Return whether ``exc`` is reported as one line, not as a traceback."""
    return isinstance(exc, UnattendedError | OSError) or is_database_error(exc)


def exit_code_for_status(status: CampaignStatus) -> int:
    """Return the exit status for a campaign's final status (a new status fails mypy here)."""
    match status:
        case "completed":
            return EXIT_OK
        case "failed" | "running":  # a command that returns leaves no campaign running
            return EXIT_FAILED
        case "blocked":
            return EXIT_BLOCKED
        case "escalated":
            return EXIT_ESCALATED
        case "awaiting_approval":
            return EXIT_AWAITING_APPROVAL
        case _:
            assert_never(status)


# A campaign's final status, as the exit status of the command that followed it.
STATUS_EXIT: Final[Mapping[CampaignStatus, int]] = {
    status: exit_code_for_status(status)
    for status in ("completed", "failed", "blocked", "escalated", "awaiting_approval")
}


def describe(exc: BaseException) -> str:
    """Return a one-line message for an error (codes and fields, no SQL, no values)."""
    if isinstance(exc, UnattendedError):
        return exc.message
    if is_database_error(exc):
        orig = getattr(exc, "orig", exc)  # SQLAlchemy wraps the driver's error
        text = str(orig).strip()
        first = text.splitlines()[0] if text else ""
        return f"cannot read the provenance database: {first or type(orig).__name__}"
    return str(exc)


def report_error(exc: BaseException) -> int:
    """Print ``exc`` on stderr as the user reads it and return its exit status.

    One ``error: ...`` line (:func:`describe`); for :class:`ProblemsFoundError`, one per
    problem and then how many. The only place a command's error is printed.
    """
    if isinstance(exc, ProblemsFoundError):
        lines = [*(f"error: {problem}" for problem in exc.problems), exc.message]
    else:
        lines = [f"error: {describe(exc)}"]
    print("\n".join(lines), file=sys.stderr)
    return exit_code_for(exc)


def closed_pipe() -> int:
    """Stop quietly when the reader went away (``| head``).

    stdout is pointed at /dev/null so Python does not complain again when it
    flushes at exit.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_OK
