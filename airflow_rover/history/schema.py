"""Creating a store's tables on first use, safely when several processes do it at once."""

from __future__ import annotations

from sqlalchemy import MetaData
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
