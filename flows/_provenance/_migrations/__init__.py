"""Alembic migrations of the provenance database (run by ``flows._provenance``)."""
