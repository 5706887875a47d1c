"""``stations token``: make, list and revoke the tokens of a server's ``--tokens`` file
(``stations.tokens``, ``stations.token_edits``). It works on the file, not through a server,
and needs no package beyond a base install's."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from typing import Protocol

from stations.commands.base import OutputFailed, Refused, Usage, write_out
from stations.token_edits import (
    add_entry,
    check_addable,
    entry_for,
    new_secret,
    remove_entries,
)
from stations.tokens import ROLES, TokensFileError, digest_of, load_tokens, parse_sha256


class Say(Protocol):
    """The CLI's line writer (a closed standard output is no traceback)."""

    def __call__(self, message: str, *, err: bool = False) -> None: ...


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "token",
        help="make, list and revoke the tokens of a --tokens file",
        description="Tokens of a server's --tokens file (see the README, Security).",
    )
    verbs = p.add_subparsers(dest="verb", required=True)
    new = verbs.add_parser(
        "new",
        help="a new random token and its tokens file entry",
        description="Print a new random token (256 bits) and its tokens file entry, which "
        "holds only the token's SHA-256: the token is shown once, for its client, and kept "
        "nowhere. With --add the entry goes into the tokens file; send SIGHUP to each server "
        "reading it to take it without a restart.",
    )
    new.add_argument("--role", required=True, choices=ROLES, help="what the token may do")
    new.add_argument(
        "--stations",
        action="append",
        default=[],
        metavar="PATTERN",
        help="a station name pattern it reaches (shop-*, orders/*); repeat for more; "
        "without it the token reaches every station",
    )
    new.add_argument(
        "--add", metavar="FILE", help="add the entry to this tokens file (made 0600 if new)"
    )
    new.add_argument("--json", action="store_true", help="print {token, entry, added} as JSON")
    listing = verbs.add_parser(
        "ls",
        help="the entries of a tokens file, without their secrets",
        description="List a tokens file's entries: role, stations and the first hex digits of "
        "each token's SHA-256 (of a written token too), never a secret.",
    )
    listing.add_argument("file", metavar="FILE", help="the tokens file")
    listing.add_argument("--json", action="store_true", help="print the entries as JSON")
    revoke = verbs.add_parser(
        "revoke",
        help="take a token out of a tokens file",
        description="Take a token's entries out of a tokens file, the token read from standard "
        "input (one line) or named by its SHA-256. Then send SIGHUP to each server reading "
        "the file: its requests are refused from then on, and what it waits for ends at once.",
    )
    revoke.add_argument("file", metavar="FILE", help="the tokens file")
    revoke.add_argument(
        "--sha256", metavar="HEX", help="the token's SHA-256 (64 hex digits), as ls --json shows it"
    )


def run(args: argparse.Namespace, say: Say) -> None:
    """The verb ``args`` names; notes on stderr go through ``say`` (the CLI's), the output
    through ``write_out``. Raises ``Usage`` (exit 2), ``Refused`` (exit 1, a file it could not
    use or change) or ``OutputFailed`` (stdout could not be written)."""
    if args.verb == "ls":
        _ls(args)
    elif args.verb == "revoke":
        _revoke(args)
    else:
        _new(args, say)


@contextlib.contextmanager
def _as_refusal(path: str) -> Iterator[None]:
    """What stops a read or change of the tokens file at ``path`` as a ``Refused``."""
    try:
        yield
    except TokensFileError as exc:
        raise Refused(str(exc)) from None
    except OSError as exc:
        # The file is replaced by a new one beside it: its folder must take a new file.
        raise Refused(f"cannot write {path} (a new file in its folder): {exc.strerror}") from None


def _ls(args: argparse.Namespace) -> None:
    with _as_refusal(args.file):
        tokens = load_tokens(args.file)
    if args.json:
        rows = [
            {"index": i, "role": t.role, "stations": list(t.stations), "sha256": t.digest.hex()}
            for i, t in enumerate(tokens)
        ]
        write_out(json.dumps(rows))
        return
    write_out(f"{'#':>3}  {'ROLE':<9} {'SHA-256':<14} STATIONS")
    for i, t in enumerate(tokens):
        stations = ", ".join(t.stations) or "(every station)"
        write_out(f"{i:>3}  {t.role:<9} {t.digest.hex()[:12]}…  {stations}")


def _revoke(args: argparse.Namespace) -> None:
    if args.sha256 is None and sys.stdin is None:  # started with stdin closed (<&-)
        raise Usage(
            "no token on standard input (it is closed): pipe the token in, or give --sha256"
        )
    if args.sha256 is not None:
        named = parse_sha256(args.sha256)
        if named is None:
            raise Usage("--sha256 must be 64 hexadecimal digits")
        digest = named
    else:
        if sys.stdin.isatty():  # typed or pasted: not shown on the screen
            import getpass

            try:
                secret = getpass.getpass("the token to revoke: ").strip()
            except EOFError:  # Ctrl-D: no token
                secret = ""
            except KeyboardInterrupt:  # Ctrl-C: nothing changed
                raise SystemExit(130) from None
        else:
            secret = _stdin_line()
        if not secret:
            raise Usage("no token on standard input (or give --sha256)")
        digest = digest_of(secret)
    with _as_refusal(args.file):
        removed, left = remove_entries(args.file, digest)
    for entry in removed:
        stations = ", ".join(entry.get("stations", [])) or "every station"
        write_out(f"revoked from {args.file}: the {entry['role']} token of {stations}")
    write_out(
        f"{args.file} holds {left} token(s) now: send SIGHUP to each server reading it "
        "(kill -HUP <pid>); with --log-level info it logs the number of tokens it read"
    )


def _stdin_line() -> str:
    """Standard input's first line, stripped. Read as bytes and decoded here: in a strict
    UTF-8 locale a line that is not UTF-8 was a UnicodeDecodeError traceback."""
    raw = sys.stdin.buffer.readline()
    try:
        return raw.decode("utf-8").strip()
    except UnicodeDecodeError as exc:
        raise Usage(f"the token on standard input is not UTF-8 text: {exc}") from None


def _new(args: argparse.Namespace, say: Say) -> None:
    for pattern in args.stations:
        if not pattern or pattern != pattern.strip():
            raise Usage(f"--stations {pattern!r}: give a station name pattern")
    secret = new_secret()
    entry = entry_for(secret, args.role, args.stations)
    # The secret is written (and flushed) before the entry goes into the file: an output that
    # fails (stdout closed, its reader gone, a full disk) then leaves the file as it was. The
    # entry added first stayed in the file while its secret was lost. A file the entry could
    # not go into is said first, though: no secret is shown that nothing would accept.
    if args.add is not None:
        with _as_refusal(args.add):
            check_addable(args.add)
    if args.json:
        write_out(json.dumps({"token": secret, "entry": entry, "added": args.add}))
    else:
        write_out(f"token: {secret}")
        write_out(f"entry: {json.dumps(entry)}")
    if args.add is not None:
        _add(args.add, entry, say)
        if args.json:
            return
        try:
            write_out(
                f"added to {args.add}: send SIGHUP to each server reading it (kill -HUP <pid>)"
            )
        except OutputFailed as exc:
            raise OutputFailed(
                f"{exc} (the token shown was added to {args.add})", exc.code
            ) from None
    if args.json:
        return
    say(
        "stations: the token is shown this once and kept nowhere (the entry holds its "
        "SHA-256): give it to its client now",
        err=True,
    )


def _add(path: str, entry: dict[str, object], say: Say) -> None:
    """``entry`` into the tokens file at ``path``, its secret shown already: a failure says
    that the token shown is not in the file."""
    try:
        with _as_refusal(path):
            add_entry(path, entry)
    except Refused as exc:
        raise Refused(f"{exc}; the token shown was not added: do not use it") from None
    except KeyboardInterrupt:  # Ctrl-C while it waited for the folder's lock
        added = _holds(path, str(entry["sha256"]))
        what = {True: "was added to", False: "was not added to", None: "may not be in"}[added]
        say(f"stations: interrupted: the token shown {what} {path}", err=True)
        raise


def _holds(path: str, sha256: str) -> bool | None:
    """Whether the tokens file at ``path`` holds an entry of this SHA-256 (None: unreadable).
    Ctrl-C may come just after the file was replaced."""
    try:
        with open(path, encoding="utf-8") as file:
            raw = json.load(file)
        return any(isinstance(e, dict) and e.get("sha256") == sha256 for e in raw.get("tokens", []))
    except FileNotFoundError:
        return False
    except (OSError, ValueError, AttributeError, TypeError):
        return None
