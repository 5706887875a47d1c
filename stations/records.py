"""Records the store returns and the domain reads: a stream's row and what follows from it
(expiry, the id window, its content type). Plain data: nothing here speaks SQL or decides.

A stream is the Durable Streams face of a station; the two are one row. The store loads and
writes it (``stations.store.streams``); creating, changing and deleting streams is decided in
the domain (``stations.domain.lifecycle``, ``catalog``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import orjson

# Every digit becomes "0", everything else a space: a run of 20 zeros is then a run of 20 digits,
# which bytes.translate and a substring search find far faster than a regular expression.
_DIGITS_ONLY = bytes(ord("0") if chr(b).isdigit() and b < 128 else ord(" ") for b in range(256))
_TWENTY_DIGITS = b"0" * 20


_NINETEEN_DIGITS = b"0" * 19
_NEGATIVE_19 = re.compile(rb"-[0-9]{19}")


def exact_ints(body: bytes) -> bool:
    """Whether orjson parsed every integer of ``body`` exactly: none has 20 digits or more,
    and none is a negative of 19 (orjson reads those below -2^63 as floats: -9223372036854775809
    was stored as -9.223372036854776e+18)."""
    digits = body.translate(_DIGITS_ONLY)
    if _TWENTY_DIGITS in digits:
        return False
    return _NINETEEN_DIGITS not in digits or _NEGATIVE_19.search(body) is None


@dataclass
class StreamState:
    id: int
    name: str
    content_type: str
    created_at: int
    ttl_seconds: int | None
    expires_at: int | None
    accessed_at: int
    closed: bool
    closer_id: str | None
    closer_epoch: int | None
    closer_seq: int | None
    tail: int
    head: int
    fork_of: int | None
    fork_offset: int | None
    deleted: bool
    stream_seq: str | None
    msg_count: int
    byte_count: int
    config: dict[str, Any] = field(default_factory=dict)
    create_spec: str | None = None
    # Copies of the config that housekeeping's statements read (see ``upkeep_columns``).
    id_window_ms: int = 120_000
    max_messages: int | None = None
    max_bytes: int | None = None
    upkeep_at: int | None = None  # when retention or DLS expiry next needs a look
    # Cached ids stored at or before it are not trusted (PATCH of the window; see idwindow).
    ids_forgotten_at: int | None = None

    @classmethod
    def from_row(cls, row: Any) -> StreamState:
        values = dict(row._mapping)
        values["config"] = _config(values["config"])
        return cls(**values)

    @classmethod
    def from_tuple(cls, row: tuple[Any, ...]) -> StreamState:
        """From a driver row in ``streams`` column order."""
        state = cls(*row)
        # orjson: every append's transaction loads its stream's row and writes it back.
        state.config = _config(state.config)  # type: ignore[arg-type]
        state.closed = bool(state.closed)
        state.deleted = bool(state.deleted)
        return state

    def expired(self, now: int) -> bool:
        if self.expires_at is not None and now >= self.expires_at:
            return True
        return self.ttl_seconds is not None and now >= self.accessed_at + self.ttl_seconds * 1000

    @property
    def is_json(self) -> bool:
        return is_json_type(self.content_type)

    @property
    def window_ms(self) -> int:
        return int(self.config.get("idempotencyWindowMs", 120_000))

    def column(self, name: str) -> Any:
        """A column's value as stored (the config as JSON text)."""
        if name == "config":
            return orjson.dumps(self.config).decode()
        return getattr(self, name)


def media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def is_json_type(content_type: str) -> bool:
    return media_type(content_type) == "application/json"


def _config(text: str | bytes) -> dict[str, Any]:
    """A stored config, read exactly: orjson would turn an integer beyond 64 bits (which a
    version without today's bounds could have stored) into a float; the standard library keeps
    it, so the settings read back are the ones stored."""
    raw = text.encode() if isinstance(text, str) else text
    value: dict[str, Any] = orjson.loads(raw) if exact_ints(raw) else json.loads(raw)
    return value
