"""Call records: every call stored as it goes, in SQLite by default or PostgreSQL for a fleet.

`open_records(settings)` gives the `CallRecords` the runtime hands to its registry (None with
`--database off`); `GET /api/calls?state=ended` and `GET /api/calls/<id>` read them back.
"""

from __future__ import annotations

from functools import partial

from parley.record_settings import RecordSettings
from parley.records.database import DatabaseError, connect
from parley.records.recorder import CallRecords
from parley.records.store import BadCursor

__all__ = ["BadCursor", "CallRecords", "DatabaseError", "open_records"]


def open_records(settings: RecordSettings, instance: str = "") -> CallRecords | None:
    """The records these settings ask for, not yet started (`start()` connects and migrates). `instance`
    names the process the records come from ('' = this host's name): calls it left open when it died are
    closed at its restart."""
    if settings.database == "off":
        return None
    return CallRecords(
        partial(connect, settings.database, settings.resolved_data_dir()),
        keep_text=settings.record_transcripts,
        retention_days=settings.retention_days,
        instance=instance,
    )
