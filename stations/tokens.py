"""The tokens file: bearer tokens, each with a role and station patterns (CONTRACT.md §5).

Read by ``stations serve --tokens FILE`` (and again on SIGHUP); made and changed by ``stations
token`` (``stations.token_edits``). Standard library only: the token commands run on a base
install, without the server.

An entry names its secret by the secret itself (``token``) or by its SHA-256 (``sha256``, 64
hex digits), so that the file (its backups, the repository of a deployment's configuration)
need not hold any secret: a stolen file then grants nothing. One plain hash is enough for
what ``stations token new`` makes, 256 random bits, where a slow password hash buys nothing::

    {"tokens": [{"sha256": "9f86d08...", "role": "admin"},
                {"token": "p1-long-secret", "role": "producer", "stations": ["orders/*"]}]}

An entry holds these keys only (a misspelt ``station`` would otherwise mean every station); a
secret appears once; ``stations``, when given, lists at least one pattern.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROLES = ("admin", "producer", "consumer")
FIELDS = ("token", "sha256", "role", "stations")  # of a tokens file entry
MIN_SECRET = 8  # characters of a secret written in the file


class TokensFileError(ValueError):
    pass


@dataclass(frozen=True)
class Token:
    digest: bytes  # the secret's SHA-256: the file may hold only that
    role: str
    stations: tuple[str, ...] = field(default_factory=tuple)  # empty: every station

    def covers(self, station: str | None) -> bool:
        if station is None or not self.stations:
            return True
        return any(fnmatch.fnmatchcase(station, pattern) for pattern in self.stations)


def digest_of(secret: str) -> bytes:
    # A header that is not UTF-8 comes decoded with surrogate escapes: it hashes as its bytes.
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).digest()


def find(tokens: list[Token], presented: str) -> Token | None:
    """Compare against every token, always all of them, in constant time per comparison."""
    if not presented:  # no token at all: nothing may match it
        return None
    given = digest_of(presented)
    match = None
    for token in tokens:
        if hmac.compare_digest(token.digest, given):
            match = token
    return match


def load_tokens(path: str) -> list[Token]:
    try:
        raw = json.loads(Path(path).read_text())
    except OSError as exc:
        raise TokensFileError(f"cannot read tokens file {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise TokensFileError(f"tokens file {path} is not JSON: {exc}") from None
    return parse_tokens(raw, path)


def parse_tokens(raw: Any, path: str) -> list[Token]:
    entries = raw.get("tokens") if isinstance(raw, dict) else None
    if not isinstance(entries, list) or not entries:
        raise TokensFileError(f'tokens file {path} needs {{"tokens": [...]}} with at least one')
    tokens = []
    first_of: dict[bytes, str] = {}
    for i, entry in enumerate(entries):
        digest, named = _secret_of(entry, i)
        if entry.get("role") not in ROLES:
            raise TokensFileError(f"tokens[{i}].role must be one of {', '.join(ROLES)}")
        patterns = entry.get("stations", [])
        if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
            raise TokensFileError(f"tokens[{i}].stations must be a list of name patterns")
        if "stations" in entry and not patterns:
            # An empty list would read as "no patterns", i.e. every station.
            raise TokensFileError(
                f"tokens[{i}].stations is empty: list at least one pattern, or leave it out "
                "for a token that reaches every station"
            )
        if digest in first_of:
            # ``find`` takes the last match: the earlier entry's role and scope would be lost.
            raise TokensFileError(f"{named} is the same secret as {first_of[digest]}")
        first_of[digest] = named
        tokens.append(Token(digest, entry["role"], tuple(patterns)))
    return tokens


def entry_digest(entry: Any) -> bytes:
    """The digest an entry names, of a file ``parse_tokens`` took."""
    return _secret_of(entry, 0)[0]


def _secret_of(entry: Any, i: int) -> tuple[bytes, str]:
    """An entry's digest, and the name of the field that gave it (for messages)."""
    if not isinstance(entry, dict) or not ("token" in entry or "sha256" in entry):
        raise TokensFileError(f"tokens[{i}] needs a string token (or the sha256 of one)")
    # Without "stations" a token reaches every station, so an entry must not lose its
    # patterns to a misspelt key ("station", "scope"): anything unknown is refused.
    unknown = sorted(set(entry) - set(FIELDS))
    if unknown:
        raise TokensFileError(f"tokens[{i}].{unknown[0][:40]} is not a field ({', '.join(FIELDS)})")
    if "token" in entry and "sha256" in entry:
        raise TokensFileError(f"tokens[{i}] gives token and sha256: give one of them")
    if "sha256" in entry:
        digest = parse_sha256(entry["sha256"])
        if digest is None:
            raise TokensFileError(f"tokens[{i}].sha256 must be 64 hexadecimal digits")
        if digest in _MISTAKES:
            # `printf %s "$TOKEN" | sha256sum` with TOKEN unset, or `echo` (its newline): the
            # first let an empty bearer token in as this entry's role.
            raise TokensFileError(
                f"tokens[{i}].sha256 is the hash of {_MISTAKES[digest]}, not of a token"
            )
        return digest, f"tokens[{i}].sha256"
    secret = entry["token"]
    if not isinstance(secret, str):
        raise TokensFileError(f"tokens[{i}].token must be a string")
    if len(secret) < MIN_SECRET:
        raise TokensFileError(f"tokens[{i}].token must be at least {MIN_SECRET} characters")
    if secret != secret.strip() or not secret.isprintable():
        # It never matched: a presented token is stripped, and no header carries a control
        # character. (Tokens with inner spaces or beyond ASCII work with curl, if not with the
        # CLI and the SDK: they load, as they did.)
        raise TokensFileError(
            f"tokens[{i}].token must not begin or end with spaces nor hold control "
            "characters: no Authorization header carries it as written"
        )
    return digest_of(secret), f"tokens[{i}].token"


_MISTAKES = {
    hashlib.sha256(b"").digest(): "an empty string",
    hashlib.sha256(b"\n").digest(): "a lone newline",
}


def parse_sha256(text: object) -> bytes | None:
    """The digest that 64 hexadecimal digits (either case) spell; None for anything else."""
    if not isinstance(text, str) or len(text) != 64:
        return None
    if not all(c in "0123456789abcdefABCDEF" for c in text):
        return None
    return bytes.fromhex(text)
