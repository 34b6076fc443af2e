"""What a call record is in the database, written event by event and read back as JSON.

Three tables (schema.py): `calls` (one row a call), `turns` (one row a turn: the newest revision's
transcript, the reply as heard, its latencies) and `call_events` (what happened, in order: every
transcript revision, replies, barge-ins, keypad digits, latencies). Each event is one transaction, so a
crash loses at most the event being written. Without transcripts (`--record-transcripts off`) no text,
digit, tool argument or result, or caller-supplied variable is stored, and the parties' numbers are
masked (records/redaction.py): only what happened and when.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from parley.pipeline.history import CALLER_TURN
from parley.records.database import Database
from parley.records.redaction import masked_party, without_text

# Events kept in call_events. `state` changes and `agent_text` pieces are not: the turn row keeps the
# reply's words as they are spoken, and `agent_done` gives what was heard.
NOT_KEPT = frozenset({"state", "agent_text", "call"})
MAX_PAGE = 200


@dataclass
class CallInfo:
    call_id: str
    transport: str
    started_at: float
    caller: str = ""
    called: str = ""
    context: dict[str, str] = field(default_factory=dict)


class RecordStore:
    def __init__(self, db: Database, *, keep_text: bool = True, instance: str = "") -> None:
        self.db = db
        self.keep_text = keep_text
        self.instance = instance

    # writing (one thread)

    def call_started(self, info: CallInfo, at: float) -> None:
        with self.db.transaction():
            self._insert_call(info, at)

    def call_event(self, call_id: str, seq: int, at: float, payload: dict[str, Any]) -> None:
        kind = str(payload.get("type", ""))
        with self.db.transaction():
            if kind not in NOT_KEPT:
                data = payload if self.keep_text else without_text(payload)
                self.db.execute(
                    "INSERT INTO call_events (call_id, seq, at, type, data) VALUES (?, ?, ?, ?, ?)",
                    (call_id, seq, at, kind, json.dumps(data, default=str)),
                )
            turn_id = payload.get("turn_id")
            if kind == "user_transcript" and turn_id:
                self._user_said(call_id, str(turn_id), seq, at, payload)
            elif kind == "agent_text" and turn_id:
                self._agent_speaking(call_id, str(turn_id), seq, at, str(payload.get("text", "")))
            elif kind == "agent_done" and turn_id:
                state = "interrupted" if payload.get("interrupted") else "committed"
                self._agent_done(call_id, str(turn_id), seq, at, str(payload.get("text", "")), state)
            elif kind == "latency" and turn_id:
                self._latency(call_id, str(turn_id), payload)
            elif kind == "barge_in":
                self.db.execute("UPDATE calls SET barge_ins = barge_ins + 1 WHERE call_id = ?", (call_id,))
            self.db.execute("UPDATE calls SET last_event_at = ? WHERE call_id = ?", (at, call_id))

    def call_ended(self, info: CallInfo, at: float, outcome: str, turns: list[dict[str, Any]]) -> None:
        """The end of a call, with its conversation as heard (the history's word is final)."""
        with self.db.transaction():
            self._insert_call(info, at)  # a call that never got past its setup was not seen before
            for position, turn in enumerate(turns):
                self._final_turn(info.call_id, position, turn)
            self.db.execute(
                "UPDATE calls SET ended_at = ?, outcome = ?, caller = ?, called = ?, last_event_at = ?, "
                "turns = (SELECT COUNT(*) FROM turns WHERE call_id = ? AND turn_id LIKE ?) "
                "WHERE call_id = ?",
                (
                    at,
                    outcome,
                    self._party(info.caller),
                    self._party(info.called),
                    at,
                    info.call_id,
                    f"%{CALLER_TURN}%",  # the caller's turns: not the agent's own lines (history.py)
                    info.call_id,
                ),
            )

    def close_lost(self) -> int:
        """Calls this instance left open when it died: ended, outcome `lost`, at their last event."""
        rows = self.db.rows(
            "SELECT call_id FROM calls WHERE instance = ? AND ended_at IS NULL", (self.instance,)
        )
        if rows:
            with self.db.transaction():
                self.db.execute(
                    "UPDATE calls SET ended_at = last_event_at, outcome = 'lost' "
                    "WHERE instance = ? AND ended_at IS NULL",
                    (self.instance,),
                )
        return len(rows)

    def heartbeat(self, now: float) -> None:
        """This instance is alive: the others read it before closing its calls."""
        self.db.execute(
            "INSERT INTO instances (instance, seen_at) VALUES (?, ?) "
            "ON CONFLICT (instance) DO UPDATE SET seen_at = excluded.seen_at",
            (self.instance, now),
        )

    def leave(self) -> None:
        """This instance stops cleanly (its calls have ended): nobody needs to watch it."""
        self.db.execute("DELETE FROM instances WHERE instance = ?", (self.instance,))

    def close_crashed(self, now: float, silent_s: float) -> list[tuple[str, str]]:
        """Calls of other instances that have not been heard from for `silent_s` (killed, or their host
        gone): ended at their last event with outcome `crashed`. Returns (instance, call id) of each."""
        rows = self.db.rows(
            "SELECT c.instance, c.call_id FROM calls c JOIN instances i ON i.instance = c.instance "
            "WHERE c.ended_at IS NULL AND c.instance <> ? AND i.seen_at < ?",
            (self.instance, now - silent_s),
        )
        if rows:
            with self.db.transaction():
                for _, call_id in rows:
                    self.db.execute(
                        "UPDATE calls SET ended_at = last_event_at, outcome = 'crashed' "
                        "WHERE call_id = ? AND ended_at IS NULL",
                        (call_id,),
                    )
        return [(str(instance), str(call_id)) for instance, call_id in rows]

    def purge(self, before: float) -> int:
        """Delete the records of calls that ended (or, never ended, last heard of) before `before`."""
        old = "SELECT call_id FROM calls WHERE COALESCE(ended_at, last_event_at) < ?"
        count = len(self.db.rows(old, (before,)))
        if count:
            with self.db.transaction():
                for table in ("call_events", "turns"):
                    self.db.execute(f"DELETE FROM {table} WHERE call_id IN ({old})", (before,))
                self.db.execute("DELETE FROM calls WHERE COALESCE(ended_at, last_event_at) < ?", (before,))
        return count

    def _insert_call(self, info: CallInfo, at: float) -> None:
        context = json.dumps(info.context if self.keep_text else {})
        self.db.execute(
            "INSERT INTO calls (call_id, transport, caller, called, context, instance, started_at, "
            "last_event_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (call_id) DO NOTHING",
            (
                info.call_id,
                info.transport,
                self._party(info.caller),
                self._party(info.called),
                context,
                self.instance,
                info.started_at,
                at,
            ),
        )

    def _text(self, text: str) -> str | None:
        return text if self.keep_text else None

    def _party(self, party: str) -> str:
        return party if self.keep_text else masked_party(party)

    def _user_said(self, call_id: str, turn_id: str, seq: int, at: float, payload: dict[str, Any]) -> None:
        # A newer revision replaces the transcript and clears the reply to the old one; an older never wins.
        self.db.execute(
            "INSERT INTO turns (call_id, turn_id, position, revision, keypad, user_text, agent_text, "
            "started_at) VALUES (?, ?, ?, ?, ?, ?, NULL, ?) ON CONFLICT (call_id, turn_id) DO UPDATE SET "
            "revision = excluded.revision, user_text = excluded.user_text, agent_text = NULL, "
            "agent_state = 'pending' WHERE turns.revision <= excluded.revision",
            (
                call_id,
                turn_id,
                seq,
                int(payload.get("revision", 0)),
                int(bool(payload.get("keypad"))),
                self._text(str(payload.get("text", ""))),
                at,
            ),
        )

    def _agent_speaking(self, call_id: str, turn_id: str, seq: int, at: float, text: str) -> None:
        self.db.execute(
            "INSERT INTO turns (call_id, turn_id, position, agent_text, agent_state, started_at) "
            "VALUES (?, ?, ?, ?, 'speaking', ?) ON CONFLICT (call_id, turn_id) DO UPDATE SET "
            "agent_text = CASE WHEN turns.agent_state = 'speaking' "
            "THEN turns.agent_text || ' ' || excluded.agent_text ELSE excluded.agent_text END, "
            "agent_state = 'speaking'",
            (call_id, turn_id, seq, self._text(text), at),
        )

    def _agent_done(self, call_id: str, turn_id: str, seq: int, at: float, text: str, state: str) -> None:
        self.db.execute(
            "INSERT INTO turns (call_id, turn_id, position, agent_text, agent_state, started_at) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (call_id, turn_id) DO UPDATE SET "
            "agent_text = excluded.agent_text, agent_state = excluded.agent_state",
            (call_id, turn_id, seq, self._text(text), state, at),
        )

    def _latency(self, call_id: str, turn_id: str, payload: dict[str, Any]) -> None:
        self.db.execute(
            "UPDATE turns SET response_s = ?, stt_s = ?, llm_first_token_s = ?, tts_first_audio_s = ? "
            "WHERE call_id = ? AND turn_id = ?",
            (
                payload.get("response_s"),
                payload.get("stt_s"),
                payload.get("llm_first_token_s"),
                payload.get("tts_first_audio_s"),
                call_id,
                turn_id,
            ),
        )

    def _final_turn(self, call_id: str, position: int, turn: dict[str, Any]) -> None:
        self.db.execute(
            "INSERT INTO turns (call_id, turn_id, position, revision, user_text, agent_text, agent_state, "
            "started_at, response_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (call_id, turn_id) DO UPDATE SET revision = excluded.revision, "
            "user_text = excluded.user_text, agent_text = excluded.agent_text, "
            "agent_state = excluded.agent_state, "
            "response_s = COALESCE(excluded.response_s, turns.response_s)",
            (
                call_id,
                str(turn["turn_id"]),
                1_000_000 + position,  # after any event's; the history's order among themselves
                int(turn.get("revision", 0)),
                self._text(str(turn.get("user", ""))),
                self._text(str(turn.get("agent", ""))),
                str(turn.get("agent_state", "pending")),
                float(turn.get("started", 0.0)),
                turn.get("response_s"),
            ),
        )

    # reading (any thread, with its own Database)

    def list_live(self, now: float, silent_s: float, limit: int = MAX_PAGE) -> list[dict[str, Any]]:
        """The calls in progress on every instance heard from within `silent_s` (a fleet's live calls),
        newest first."""
        rows = self.db.rows(
            f"SELECT {_SUMMARY} FROM calls WHERE ended_at IS NULL AND instance IN "
            "(SELECT instance FROM instances WHERE seen_at >= ?) "
            "ORDER BY started_at DESC, call_id DESC LIMIT ?",
            (now - silent_s, limit),
        )
        return [_summary(row) for row in rows]

    def list_ended(self, limit: int = 50, cursor: str = "") -> tuple[list[dict[str, Any]], str | None]:
        """One page of ended calls, newest first, and the cursor of the next page (None: no more)."""
        limit = max(1, min(limit, MAX_PAGE))
        where, params = "ended_at IS NOT NULL", []
        if cursor:
            started, call_id = decode_cursor(cursor)
            where += " AND (started_at < ? OR (started_at = ? AND call_id < ?))"
            params = [started, started, call_id]
        rows = self.db.rows(
            f"SELECT {_SUMMARY} FROM calls WHERE {where} ORDER BY started_at DESC, call_id DESC LIMIT ?",
            (*params, limit + 1),
        )
        page = [_summary(row) for row in rows[:limit]]
        more = len(rows) > limit
        return page, encode_cursor(page[-1]["started"], page[-1]["id"]) if more and page else None

    def set_after(self, call_id: str, name: AfterCall, value: Any) -> None:
        """Keep what became known of a call after its turns (`amd`, `recording`, `analysis`), as JSON."""
        with self.db.transaction():
            self.db.execute(f"UPDATE calls SET {name} = ? WHERE call_id = ?", (json.dumps(value), call_id))

    def get(self, call_id: str) -> dict[str, Any] | None:
        rows = self.db.rows(
            f"SELECT {_SUMMARY}, amd, recording, analysis, context FROM calls WHERE call_id = ?", (call_id,)
        )
        if not rows:
            return None
        record = _summary(rows[0])
        record["context"] = json.loads(rows[0][-1] or "{}")
        for name, value in zip(AFTER_CALL, rows[0][-4:-1], strict=True):
            if value is not None:
                record[name] = json.loads(value)
        turns = self.db.rows(
            "SELECT turn_id, revision, keypad, user_text, agent_text, agent_state, started_at, response_s, "
            "stt_s, llm_first_token_s, tts_first_audio_s FROM turns WHERE call_id = ? "
            "ORDER BY started_at, position",
            (call_id,),
        )
        events = [
            (at, kind, json.loads(data))
            for at, kind, data in self.db.rows(
                "SELECT at, type, data FROM call_events WHERE call_id = ? ORDER BY seq", (call_id,)
            )
        ]
        record["transcript"] = [_turn(row, events) for row in turns]
        record["dtmf"] = [
            {"at": at, "digit": data.get("digit")} for at, kind, data in events if kind == "dtmf"
        ]
        record["interruptions"] = [
            {"at": at, "by": data.get("by"), "stop_s": data.get("stop_s")}
            for at, kind, data in events
            if kind == "barge_in"
        ]
        record["events"] = [{"at": at, "type": kind, **data} for at, kind, data in events]
        return record


AfterCall = Literal["amd", "recording", "analysis"]
AFTER_CALL: tuple[AfterCall, ...] = ("amd", "recording", "analysis")
_SUMMARY = "call_id, transport, caller, called, instance, started_at, ended_at, outcome, turns, barge_ins"


def _summary(row: tuple[Any, ...]) -> dict[str, Any]:
    call_id, transport, caller, called, instance, started, ended, outcome, turns, barge_ins = row[:10]
    return {
        "id": call_id,
        "transport": transport,
        "caller": caller,
        "called": called,
        "instance": instance,
        "started": started,
        "ended": ended,
        "duration_s": None if ended is None else round(ended - started, 3),
        "state": "ended" if ended is not None else "active",
        "ended_reason": outcome,
        "turns": turns,
        "barge_ins": barge_ins,
    }


def _turn(row: tuple[Any, ...], events: list[tuple[float, str, dict[str, Any]]]) -> dict[str, Any]:
    turn_id, revision, keypad, user, agent, state, started, response_s, stt_s, llm_s, tts_s = row
    revisions = [
        {"revision": data.get("revision", 0), "text": data.get("text"), "at": at}
        for at, kind, data in events
        if kind == "user_transcript" and data.get("turn_id") == turn_id
    ]
    return {
        "turn_id": turn_id,
        "revision": revision,
        "keypad": bool(keypad),
        "user": user,
        "agent": agent,
        "agent_state": state,
        "interrupted": state == "interrupted",
        "started": started,
        "response_s": response_s,
        "stt_s": stt_s,
        "llm_first_token_s": llm_s,
        "tts_first_audio_s": tts_s,
        "revisions": revisions,
    }


def encode_cursor(started: float, call_id: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([started, call_id]).encode()).decode().rstrip("=")


class BadCursor(ValueError):
    pass


def decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        started, call_id = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        return float(started), str(call_id)
    except (ValueError, TypeError, binascii.Error) as exc:
        raise BadCursor("not a cursor this service gave out") from exc
