"""Prefect flows, approvals, the provenance store, settings and the ``unattended`` CLI.

Importing ``flows`` is cheap: nothing here imports Prefect until a flow is used,
so ``unattended inspect`` starts fast.
"""

__all__: list[str] = []
