"""Alembic environment: run on the connection ``flows._provenance`` hands over.

There is no ``alembic.ini`` at runtime; the store builds the ``Config`` in code
and passes an open connection (already inside a locking transaction) in
``config.attributes["connection"]``.
"""

from __future__ import annotations

from alembic import context

from flows._provenance._schema import metadata

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("the provenance migrations run only through flows._provenance")

context.configure(
    connection=connection,
    target_metadata=metadata,
    # SQLite cannot ALTER most things in place; batch mode copies the table.
    render_as_batch=connection.dialect.name == "sqlite",
    transactional_ddl=True,
)
with context.begin_transaction():
    context.run_migrations()
