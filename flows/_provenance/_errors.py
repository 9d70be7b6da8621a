"""The errors the provenance store raises, inside the project's taxonomy.

::

    UnattendedError
    ├── ProvenanceDatabaseError     spec_invalid         not a provenance DB we can use
    ├── SpecChanged                 spec_changed         an input differs from the pinned one
    ├── DecisionMismatch            decision_mismatch    a replay derives another decision
    ├── CampaignFenced              fenced_out           another run holds the campaign's lease
    ├── StorageUnavailable          storage_unavailable  disk full, read-only, locked (retryable)
    └── NotFound               not_found      (from ``policies``) unknown campaign, round, key
"""

# The taxonomy names outcomes (SpecChanged, CampaignFenced), as ``policies`` does.
# ruff: noqa: N818

from __future__ import annotations

from policies import SpecInvalid, UnattendedError


class ProvenanceDatabaseError(UnattendedError):
    """The database is missing, corrupt, not SQLite, or from a newer schema.

    ``details`` names the location (``path`` or ``url`` without password) and,
    for schema mismatches, the ``revision`` found and the ``head`` this code knows.
    """

    code = "spec_invalid"


class SpecChanged(SpecInvalid):
    """A file the spec names differs from the content pinned at first submission.

    ``details`` names the ``input`` (spec, policy, transcript, site, simulation),
    its ``file`` and the pinned and current hashes.
    """

    code = "spec_changed"


class DecisionMismatch(UnattendedError):
    """A replayed round derives a different policy decision than the one recorded."""

    code = "decision_mismatch"


class CampaignFenced(UnattendedError):
    """Another run holds the campaign's lease: this one must not record or launch anything."""

    code = "fenced_out"


class StorageUnavailable(UnattendedError):
    """The provenance database cannot be written (disk full, read-only, locked) after retries."""

    code = "storage_unavailable"
    default_retryable = True
