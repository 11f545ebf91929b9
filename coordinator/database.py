"""Connecting to the database: an engine tuned for the coordinator's use, and telling a fault
of the storage below the database (disk full, read-only) from a fault of a query.

Why apart from :mod:`coordinator.store`: the store is about what a write means (one
transaction, caches); this is about the SQLite connection itself, its pragmas and its errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError


def is_storage_fault(exc: DBAPIError) -> bool:
    """Faults of the storage below the database (not of a query): worth a 503, not a 500."""
    text = str(exc.orig).lower()
    return any(word in text for word in ("disk is full", "readonly", "read-only", "disk i/o",
                                         "unable to open", "database is locked"))


def make_engine(url: str) -> Engine:
    """An engine with SQLite tuned for one writer and many readers (WAL, busy timeout)."""
    is_sqlite = url.startswith("sqlite")
    if is_sqlite and url.startswith("sqlite:///") and ":memory:" not in url:
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    kwargs: dict[str, Any] = {}
    if is_sqlite:
        kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
    engine = create_engine(url, **kwargs)
    if is_sqlite:
        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            # WAL + NORMAL: a commit is durable against a crash of the coordinator (the WAL is
            # on disk); only an OS crash or power loss can lose the last commits. Spares
            # every telemetry report an fsync.
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()
    return engine
