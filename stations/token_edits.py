"""Changes of a tokens file (``stations.tokens``) for ``stations token``: a new secret and its
entry, an entry added, a token's entries taken out. Each change locks the file's folder, reads
the file, checks it loads before and after, and replaces it whole (fsynced, then renamed, then
the folder fsynced: a token shown is in the file, a revoked one is not, across a power cut). Only
the CLI uses this; the server reads the file and nothing else."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stations.tokens import TokensFileError, digest_of, entry_digest, parse_tokens


def new_secret() -> str:
    """256 random bits, URL-safe (no character a header or a shell would mangle), never
    beginning with ``-``: ``--token -AbC...`` reads as an option on a command line (1 in 64
    of them did)."""
    while True:
        secret = secrets.token_urlsafe(32)
        if not secret.startswith("-"):
            return secret


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
    left = 0

    def change(entries: list[Any]) -> None:
        nonlocal left
        kept: list[Any] = []
        for entry in entries:
            matches = entry_digest(entry) == digest
            (removed if matches else kept).append(entry)
        if not removed:
            raise TokensFileError(f"{path} holds no entry of this token")
        if not kept:
            raise TokensFileError(
                f"this is the last token of {path}: a server does not start on a file without "
                "one (add another first)"
            )
        entries[:] = kept
        left = len(kept)

    _rewrite(path, change, "the token was revoked", create=False)
    return removed, left


def _rewrite(
    path: str, change: Callable[[list[Any]], None], doing: str, *, create: bool = True
) -> None:
    """Apply ``change`` to the entries of the tokens file at ``path`` (through a symbolic link,
    to the file it names; with ``create``, a file that is not there or is empty is begun,
    0600). The file must load before and after; it is replaced whole (a server reading it on
    SIGHUP meanwhile sees the old file or the new one) and keeps its mode and owner. Two
    changes at once take turns (a lock on the folder); a change by hand seen meanwhile (the
    file is read again just before the replace) refuses this one."""
    target = Path(os.path.realpath(path))
    folder = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        before, found, raw = _loaded(target, path, create)
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
                        whose = "user" if found.st_uid != os.getuid() else "group"
                        raise TokensFileError(
                            f"{path} belongs to another {whose}: change it as a user who may "
                            "give it that owner (or root)"
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


def check_addable(path: str) -> None:
    """Raise what ``add_entry`` would for the file at ``path`` as it is now (not JSON, a
    token the server refuses, other hard links, a folder that takes no new file), without
    changing it: ``stations token new`` shows no secret that could not be added."""
    target = Path(os.path.realpath(path))
    _loaded(target, path, create=True)
    os.stat(target.parent)  # a folder that is not there says so (not "Permission denied")
    if not os.access(target.parent, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(target.parent))


def _loaded(target: Path, path: str, create: bool) -> tuple[str, os.stat_result | None, Any]:
    """The tokens file's text, its stat (None: there is none) and its JSON, checked as a
    change needs it: it loads, and has no other hard links."""
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
    return before, found, raw


def _read(target: Path, path: str) -> str:
    """The file's text; "" when there is none."""
    try:
        # UTF-8 whatever the locale: JSON is (RFC 8259 §8.1).
        return target.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ""
    except OSError as exc:
        raise TokensFileError(f"cannot read tokens file {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:  # it was a traceback: one line, as for other bad files
        raise TokensFileError(f"tokens file {path} is not UTF-8 text: {exc}") from None
