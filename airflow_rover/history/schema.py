"""Creating a store's tables on first use, and adding the columns newer versions gave them,
safely when several processes do it at once."""

from __future__ import annotations

from sqlalchemy import MetaData, Table, inspect, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

ATTEMPTS = 5


def create_tables(engine: Engine, metadata: MetaData) -> None:
    """``create_all`` that tolerates another process creating a table between the check and
    the create (it then exists: the next attempt skips it)."""
    for attempt in range(ATTEMPTS):
        try:
            metadata.create_all(engine, checkfirst=True)
            return
        except DBAPIError:
            if attempt == ATTEMPTS - 1:
                raise


def add_missing_columns(engine: Engine, table: Table) -> None:
    """Add the nullable columns of ``table`` that a database made by an older version lacks
    (its older rows hold NULL there); a concurrent upgrader adding one first is fine."""
    present = {c["name"] for c in inspect(engine).get_columns(table.name)}
    for column in table.columns:
        if column.name in present or not column.nullable:
            continue
        kind = column.type.compile(dialect=engine.dialect)
        try:
            with engine.begin() as conn:
                conn.execute(text(f"ALTER TABLE {table.name} ADD COLUMN {column.name} {kind}"))
        except DBAPIError:  # another process added it meanwhile
            if column.name not in {c["name"] for c in inspect(engine).get_columns(table.name)}:
                raise
