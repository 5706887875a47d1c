"""The tokens file: bearer tokens, each with a role and station patterns (CONTRACT.md §5).

Read by ``stations serve --tokens FILE`` (and again on SIGHUP), written by ``stations token
new``. Standard library only: the token commands run on a base install, without the server.

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

import contextlib
import fcntl
import fnmatch
import hashlib
import hmac
import json
import os
import secrets
import tempfile
from collections.abc import Callable
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


def _secret_of(entry: Any, i: int) -> tuple[bytes, str]:
    """An entry's digest, and the name of the field that gave it (for messages)."""
    if not isinstance(entry, dict) or not (
        isinstance(entry.get("token"), str) or isinstance(entry.get("sha256"), str)
    ):
        raise TokensFileError(f"tokens[{i}] needs a string token (or the sha256 of one)")
    # Without "stations" a token reaches every station, so an entry must not lose its
    # patterns to a misspelt key ("station", "scope"): anything unknown is refused.
    unknown = sorted(set(entry) - set(FIELDS))
    if unknown:
        raise TokensFileError(f"tokens[{i}].{unknown[0][:40]} is not a field ({', '.join(FIELDS)})")
    if "token" in entry and "sha256" in entry:
        raise TokensFileError(f"tokens[{i}] gives token and sha256: give one of them")
    if "sha256" in entry:
        hexed = entry["sha256"]
        if not isinstance(hexed, str) or len(hexed) != 64 or not _is_hex(hexed):
            raise TokensFileError(f"tokens[{i}].sha256 must be 64 hexadecimal digits")
        digest = bytes.fromhex(hexed)
        if digest in _MISTAKES:
            # `printf %s "$TOKEN" | sha256sum` with TOKEN unset, or `echo` (its newline): the
            # first let an empty bearer token in as this entry's role.
            raise TokensFileError(
                f"tokens[{i}].sha256 is the hash of {_MISTAKES[digest]}, not of a token"
            )
        return digest, f"tokens[{i}].sha256"
    secret = entry["token"]
    if not isinstance(secret, str):
        raise TokensFileError(f"tokens[{i}] needs a string token (or the sha256 of one)")
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


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdefABCDEF" for c in text)


def new_secret() -> str:
    """256 random bits, URL-safe (no character a header or a shell would mangle)."""
    return secrets.token_urlsafe(32)


def entry_for(secret: str, role: str, stations: list[str]) -> dict[str, Any]:
    """The tokens file entry of ``secret``: its SHA-256, never the secret itself."""
    entry: dict[str, Any] = {"sha256": digest_of(secret).hex(), "role": role}
    if stations:
        entry["stations"] = list(stations)
    return entry


def add_entry(path: str, entry: dict[str, Any]) -> None:
    """Add ``entry`` to the tokens file at ``path`` (made, 0600, if there is none), as
    ``_rewrite`` changes a file."""
    _rewrite(path, lambda entries: entries.append(entry), "the entry was added")


def remove_entries(path: str, digest: bytes) -> tuple[list[dict[str, Any]], int]:
    """Take the entries of the token whose SHA-256 is ``digest`` out of the tokens file at
    ``path`` (``_rewrite``); return them and how many tokens the file holds now. The file's
    last token is not taken: a server would not start on a file without one."""
    removed: list[dict[str, Any]] = []
    left: list[int] = []

    def change(entries: list[Any]) -> None:
        kept: list[Any] = []
        for entry in entries:
            matches = isinstance(entry, dict) and _digest_of_entry(entry) == digest
            (removed if matches else kept).append(entry)
        if not removed:
            raise TokensFileError(f"{path} holds no entry of this token")
        if not kept:
            raise TokensFileError(
                f"this is the last token of {path}: a server does not start on a file without "
                "one (add another first)"
            )
        entries[:] = kept
        left.append(len(kept))

    _rewrite(path, change, "the token was revoked", create=False)
    return removed, left[-1]


def _digest_of_entry(entry: dict[str, Any]) -> bytes | None:
    if isinstance(entry.get("token"), str):
        return digest_of(entry["token"])
    if isinstance(entry.get("sha256"), str):
        return bytes.fromhex(entry["sha256"])
    return None


def _rewrite(
    path: str, change: Callable[[list[Any]], None], doing: str, *, create: bool = True
) -> None:
    """Apply ``change`` to the entries of the tokens file at ``path`` (through a symbolic link,
    to the file it names; with ``create``, a file that is not there or is empty is begun,
    0600). The file must load before and after; it is replaced whole (a server reading it on
    SIGHUP meanwhile sees the old file or the new one) and keeps its mode and owner. Two
    changes at once take turns (a lock on the folder), and one made by hand meanwhile is not
    overwritten: the change is refused."""
    target = Path(os.path.realpath(path))
    folder = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        before = _read(target, path)
        found = target.stat() if target.exists() else None
        if not before.strip() and not create:
            raise TokensFileError(f"{path} holds no tokens (there is no such file, or it is empty)")
        try:
            raw = json.loads(before) if before.strip() else {"tokens": []}
        except ValueError as exc:
            raise TokensFileError(f"tokens file {path} is not JSON: {exc}") from None
        if not (isinstance(raw, dict) and raw.get("tokens") == []):  # a file begun by hand
            parse_tokens(raw, path)  # a file the server would refuse is not changed
        if found is not None and found.st_nlink > 1:
            # The new file would not be the one the other names read: a revoked token would
            # still work for a server reading it by another name.
            raise TokensFileError(
                f"{path} has {found.st_nlink - 1} other hard link(s): a server reading it by "
                "another name would not see the change; change it in place by hand, or make "
                "the other names symbolic links"
            )
        change(raw["tokens"])
        parse_tokens(raw, path)
        fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        try:
            with os.fdopen(fd, "w") as out:
                out.write(json.dumps(raw, indent=2) + "\n")
                out.flush()
                os.fsync(out.fileno())
            if found is not None:
                os.chmod(temporary, found.st_mode & 0o777)
                if (found.st_uid, found.st_gid) != (os.getuid(), os.getgid()):
                    try:
                        os.chown(temporary, found.st_uid, found.st_gid)
                    except PermissionError:
                        raise TokensFileError(
                            f"{path} belongs to another user: change it as that user (or root)"
                        ) from None
            else:
                os.chmod(temporary, 0o600)
            if _read(target, path) != before:
                raise TokensFileError(f"{path} changed while {doing}: try again")
            os.replace(temporary, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(temporary)
            raise
        os.fsync(folder)  # the rename too: a token shown must be in the file, a revoked one not
    finally:
        os.close(folder)


def _read(target: Path, path: str) -> str:
    """The file's text; "" when there is none."""
    try:
        return target.read_text()
    except FileNotFoundError:
        return ""
    except OSError as exc:
        raise TokensFileError(f"cannot read tokens file {path}: {exc.strerror}") from None
