"""Tables of their own in a history store's database: the frame the running-jobs registry and
the launch index share (their own ``MetaData``, created on first use, closed with the store)."""

from __future__ import annotations

from types import TracebackType
from typing import ClassVar, Self

from sqlalchemy import MetaData

from airflow_rover.history.schema import create_tables
from airflow_rover.history.store import HistoryStore


class StoreTables:
    """Reads and writes the tables of ``metadata`` in ``store``'s database."""

    metadata: ClassVar[MetaData]

    def __init__(self, store: HistoryStore) -> None:
        self.store = store
        self.engine = store.engine
        self._schema_ready = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.store!r})"

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self.store.close()

    def ensure_schema(self) -> None:
        """Create the tables that do not exist yet, then bring older ones up to date
        (idempotent, race-safe)."""
        if self._schema_ready:
            return
        create_tables(self.engine, self.metadata)
        self.upgrade()
        self._schema_ready = True

    def upgrade(self) -> None:
        """Add what tables made by an older version lack (nothing by default)."""
