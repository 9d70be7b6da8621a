"""The errors the provenance store raises, inside the project's taxonomy.

::

    UnattendedError
    ├── ProvenanceDatabaseError     spec_invalid   the file/URL is not a provenance DB we can use
    └── NotFound               not_found      (from ``policies``) unknown campaign, round, key
"""

from __future__ import annotations

from policies import UnattendedError


class ProvenanceDatabaseError(UnattendedError):
    """The database is missing, corrupt, not SQLite, or from a newer schema.

    ``details`` names the location (``path`` or ``url`` without password) and,
    for schema mismatches, the ``revision`` found and the ``head`` this code knows.
    """

    code = "spec_invalid"
