"""Station configuration: defaults, validation and the mutable subset.

A station is a Durable Streams stream with settings. The config is stored as JSON beside the
stream; validation names the offending field as a dotted path, as the contract asks.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from stations.domain.fields import body_of, object_of
from stations.errors import BadRequest

DEFAULT_CONTENT_TYPE = "application/json"
MIN_WINDOW_MS = 100
MAX_WINDOW_MS = 86_400_000
MIN_ACK_MS = 100
MAX_ACK_MS = 43_200_000
MAX_DELIVERIES = 1000
# Upper bounds of the other numbers: an age or a DLS retention up to 100 years (365-day years),
# counts and sizes up to 2^53 - 1 (the largest integer every JSON client reads exactly). Larger
# values would overflow the database's 64-bit arithmetic on ``now - age``.
MAX_AGE_MS = 100 * 365 * 86_400_000  # 3153600000000
MAX_COUNT = 2**53 - 1  # 9007199254740991
MAX_NAME = 512

# Printable ASCII without spaces or URL-structural characters that would make a path ambiguous;
# "/" is allowed (names are stream paths) but not at either end or doubled.
_NAME = re.compile(r"[A-Za-z0-9._~\-]+(/[A-Za-z0-9._~\-]+)*")
_CONTENT_TYPE = re.compile(r"[A-Za-z0-9!#$&^_.+\-]+/[A-Za-z0-9!#$&^_.+\-]+([ \t]*;[\x20-\x7e]*)?")

DEFAULTS: dict[str, Any] = {
    "contentType": DEFAULT_CONTENT_TYPE,
    "idempotencyWindowMs": 120_000,
    "retention": {"maxAgeMs": None, "maxMessages": None, "maxBytes": None},
    "dls": {"poison": True, "forwardTo": None, "retentionMs": None},
    "consumerDefaults": {"maxAckTimeMs": 30_000, "maxMsgDeliveries": 2},
}

# Keys a section may hold that are left out while unset, so configs stored before they existed
# compare equal to new ones.
OPTIONAL = {"dls": {"redrive"}}
MAX_REDRIVES = 1000
MAX_REDRIVE_DELAY_MS = 7 * 86_400_000

# Everything but the name and content type may change on a standing station.
MUTABLE = ("idempotencyWindowMs", "retention", "dls", "consumerDefaults")


def validate_name(name: Any, field: str = "name") -> str:
    if not isinstance(name, str) or not name:
        raise BadRequest(f"{field} is required and must be a station name (a string)", field)
    if len(name) > MAX_NAME:
        raise BadRequest(f"{field} is longer than {MAX_NAME} characters", field)
    if not _NAME.fullmatch(name):
        raise BadRequest(
            f"{field} may hold letters, digits, '.', '_', '~', '-' and single '/' between segments",
            field,
        )
    segments = name.split("/")
    if segments[0] == "__ds":
        raise BadRequest(f"{field}: a first segment '__ds' is reserved (protocol routes)", field)
    if "." in segments or ".." in segments:
        # URL clients resolve these away: such a station could never be reached again.
        raise BadRequest(f"{field} may not have '.' or '..' as a segment", field)
    return name


def validate_content_type(value: Any, field: str = "contentType") -> str:
    if not isinstance(value, str) or not _CONTENT_TYPE.fullmatch(value) or len(value) > 255:
        raise BadRequest("contentType must be a MIME type such as application/json", field)
    return value


def _int_in(value: Any, field: str, lo: int, hi: int, nullable: bool = False) -> int | None:
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        kind = "an integer or null" if nullable else "an integer"
        raise BadRequest(f"{field} must be {kind}", field)
    if not lo <= value <= hi:
        shown = (
            str(value)
            if len(str(value)) <= 40
            else f"{str(value)[:20]}... ({len(str(value))} digits)"
        )
        raise BadRequest(f"{field} must be between {lo} and {hi} (got {shown})", field)
    return value


def _section(raw: dict[str, Any], key: str) -> dict[str, Any]:
    value = raw.get(key, {})
    return object_of(
        {} if value is None else value, key, DEFAULTS[key].keys() | OPTIONAL.get(key, set())
    )


def _validate_settings(raw: dict[str, Any], base: dict[str, Any], name: str) -> dict[str, Any]:
    """Validate the mutable settings in ``raw`` on top of ``base``; return the merged config."""
    out = copy.deepcopy(base)
    if "idempotencyWindowMs" in raw:
        out["idempotencyWindowMs"] = _int_in(
            raw["idempotencyWindowMs"], "idempotencyWindowMs", MIN_WINDOW_MS, MAX_WINDOW_MS
        )
    if "retention" in raw:
        section = _section(raw, "retention")
        for key in ("maxAgeMs", "maxMessages", "maxBytes"):
            if key in section:
                hi = MAX_AGE_MS if key == "maxAgeMs" else MAX_COUNT
                out["retention"][key] = _int_in(section[key], f"retention.{key}", 1, hi, True)
    if "dls" in raw:
        section = _section(raw, "dls")
        if "poison" in section:
            if not isinstance(section["poison"], bool):
                raise BadRequest("dls.poison must be true or false", "dls.poison")
            out["dls"]["poison"] = section["poison"]
        if "forwardTo" in section:
            target = section["forwardTo"]
            if target is not None:
                validate_name(target, "dls.forwardTo")
                if target == name:
                    # Dead letters forwarded into their own station could loop for ever.
                    raise BadRequest(
                        "dls.forwardTo must name another station, not the station itself",
                        "dls.forwardTo",
                    )
            out["dls"]["forwardTo"] = target
        if "retentionMs" in section:
            out["dls"]["retentionMs"] = _int_in(
                section["retentionMs"], "dls.retentionMs", 1, MAX_AGE_MS, True
            )
        if "redrive" in section:
            policy = parse_redrive(section["redrive"])
            if policy is None:
                out["dls"].pop("redrive", None)
            else:
                out["dls"]["redrive"] = policy
    if "consumerDefaults" in raw:
        section = _section(raw, "consumerDefaults")
        if "maxAckTimeMs" in section:
            out["consumerDefaults"]["maxAckTimeMs"] = _int_in(
                section["maxAckTimeMs"], "consumerDefaults.maxAckTimeMs", MIN_ACK_MS, MAX_ACK_MS
            )
        if "maxMsgDeliveries" in section:
            out["consumerDefaults"]["maxMsgDeliveries"] = _int_in(
                section["maxMsgDeliveries"],
                "consumerDefaults.maxMsgDeliveries",
                1,
                MAX_DELIVERIES,
            )
    return out


def parse_redrive(raw: Any) -> dict[str, Any] | None:
    """``dls.redrive``: move dead letters back to their group automatically, each at most
    ``maxRedrives`` times, ``delayMs * backoff**n`` (at most ``maxDelayMs``) after its n-th
    dead-lettering. Null turns redrive off."""
    if raw is None:
        return None
    allowed = {"maxRedrives", "delayMs", "backoff", "maxDelayMs"}
    raw = object_of(raw, "dls.redrive", allowed, {"maxRedrives"}, shape="an object or null")
    policy: dict[str, Any] = {
        "maxRedrives": _int_in(raw["maxRedrives"], "dls.redrive.maxRedrives", 1, MAX_REDRIVES),
        "delayMs": _int_in(
            raw.get("delayMs", 60_000), "dls.redrive.delayMs", 0, MAX_REDRIVE_DELAY_MS
        ),
    }
    backoff = raw.get("backoff", 1)
    if isinstance(backoff, bool) or not isinstance(backoff, int | float) or not 1 <= backoff <= 10:
        raise BadRequest("dls.redrive.backoff must be a number from 1 to 10", "dls.redrive.backoff")
    policy["backoff"] = backoff
    policy["maxDelayMs"] = _int_in(
        raw.get("maxDelayMs", MAX_REDRIVE_DELAY_MS),
        "dls.redrive.maxDelayMs",
        policy["delayMs"],
        MAX_REDRIVE_DELAY_MS,
    )
    return policy


def parse_config(raw: Any) -> dict[str, Any]:
    """A full StationConfig from a create request, defaults filled in."""
    raw = body_of(raw, {"name", *DEFAULTS})
    config = {"name": validate_name(raw.get("name"))}
    base = copy.deepcopy(DEFAULTS)
    if "contentType" in raw:
        base["contentType"] = validate_content_type(raw["contentType"])
    config.update(_validate_settings(raw, base, config["name"]))
    return config


def apply_patch(current: dict[str, Any], raw: Any) -> dict[str, Any]:
    """The config after a PATCH; name and content type are fixed at creation."""
    raw = body_of(raw, {"name", *DEFAULTS})
    if "name" in raw and raw["name"] != current["name"]:
        raise BadRequest("a station cannot be renamed", "name")
    if "contentType" in raw and raw["contentType"] != current["contentType"]:
        raise BadRequest("contentType is fixed when the station is created", "contentType")
    for key in ("idempotencyWindowMs", "retention", "dls", "consumerDefaults"):
        if key in raw and raw[key] is None:
            # "Leave it" or "reset it"? It was taken as the first, silently (200, no change);
            # a client that meant the second must be told.
            raise BadRequest(
                f"{key} may not be null: leave it out to keep it, or give the keys to change "
                "(a limit set to null is removed)",
                key,
            )
    return _validate_settings(raw, current, str(current.get("name", "")))


def first_difference(existing: Any, requested: Any, path: str = "") -> tuple[str, Any, Any] | None:
    """The first setting (a dotted path) where two configs differ, with both values."""
    if isinstance(existing, dict) and isinstance(requested, dict):
        for key in sorted(set(existing) | set(requested)):
            found = first_difference(
                existing.get(key), requested.get(key), f"{path}.{key}" if path else key
            )
            if found is not None:
                return found
        return None
    return None if existing == requested else (path, existing, requested)


def default_config(name: str, content_type: str) -> dict[str, Any]:
    """The config of a stream created through the Durable Streams door (PUT)."""
    config = {"name": name, **copy.deepcopy(DEFAULTS)}
    config["contentType"] = content_type
    return config
