"""Tokens files that hold no secret: entries by SHA-256, and ``stations token new``, which
makes a token, prints it once and adds only its hash to the file. A plain tokens file granted
everything to whoever read it (a backup, a deployment's configuration repository)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import clikit
from tests.harness import Server
from tests.test_cli import assert_one_line_error, run_cli

ADMIN = "admin-secret-tokens-file"


def _sha(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _new(tmp_path: Path, *args: str) -> dict[str, Any]:
    """``stations token new ... --json``: {token, entry, added}."""
    proc = run_cli(["token", "new", *args, "--json"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    answer: dict[str, Any] = json.loads(proc.stdout)
    return answer


def _status(server: Server, token: str, method: str, path: str, body: Any = None) -> int:
    headers = {"Authorization": f"Bearer {token}"}
    return httpx.request(method, server.url + path, json=body, headers=headers).status_code


def test_made_tokens_work_from_a_file_that_holds_none_of_them(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"tokens": [{"sha256": _sha(ADMIN), "role": "admin"}]}))
    made = _new(tmp_path, "--role", "producer", "--stations", "shop-*", "--add", str(tokens))
    secret = made["token"]
    assert len(secret) >= 43  # 256 bits, URL-safe base64
    assert made["entry"] == {"sha256": _sha(secret), "role": "producer", "stations": ["shop-*"]}
    assert made["added"] == str(tokens)
    assert secret not in tokens.read_text() and ADMIN not in tokens.read_text()
    server = Server(f"sqlite:///{tmp_path / 'db.sqlite'}", tmp_path, ["--tokens", str(tokens)])
    server.start()
    assert server.proc is not None
    try:
        for name in ("shop-1", "other"):
            assert _status(server, ADMIN, "POST", "/api/stations", {"name": name}) == 201
        produce = {"messages": [{"data": 1}]}
        assert _status(server, secret, "POST", "/api/stations/shop-1/messages", produce) == 200
        assert _status(server, secret, "POST", "/api/stations/other/messages", produce) == 403
        assert _status(server, secret, "DELETE", "/api/stations/shop-1") == 403  # not admin
        assert _status(server, _sha(secret), "GET", "/api/stations") == 401  # the hash is no key
        # One more, added while the server runs: taken at the SIGHUP.
        later = _new(tmp_path, "--role", "consumer", "--add", str(tokens))["token"]
        assert _status(server, later, "GET", "/api/stations") == 401
        server.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while _status(server, later, "GET", "/api/stations") != 200:
            assert time.monotonic() < deadline, "the added token was not taken on SIGHUP"
            time.sleep(0.05)
        assert _status(server, secret, "POST", "/api/stations/shop-1/messages", produce) == 200
        # Revoked by the token itself (the file holds only its hash), then SIGHUP.
        revoked = clikit.run("token", "revoke", str(tokens), cwd=tmp_path, stdin=secret + "\n")
        assert revoked.returncode == 0, revoked.stderr
        assert "the producer token of shop-*" in revoked.stdout
        assert "holds 2 token(s) now" in revoked.stdout
        server.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while _status(server, secret, "GET", "/api/stations") != 401:
            assert time.monotonic() < deadline, "the revoked token still works after SIGHUP"
            time.sleep(0.05)
        assert _status(server, later, "GET", "/api/stations") == 200
    finally:
        server.kill()


def test_a_new_tokens_file_is_private_and_an_existing_one_keeps_its_mode(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh.json"
    _new(tmp_path, "--role", "admin", "--add", str(fresh))
    assert oct(fresh.stat().st_mode & 0o777) == oct(0o600)
    shared = tmp_path / "shared.json"
    shared.write_text(json.dumps({"tokens": [{"sha256": _sha(ADMIN), "role": "admin"}]}))
    shared.chmod(0o640)
    _new(
        tmp_path,
        "--role",
        "consumer",
        "--stations",
        "a*",
        "--stations",
        "b/*",
        "--add",
        str(shared),
    )
    assert oct(shared.stat().st_mode & 0o777) == oct(0o640)
    entries = json.loads(shared.read_text())["tokens"]
    assert [e["role"] for e in entries] == ["admin", "consumer"]
    assert entries[1]["stations"] == ["a*", "b/*"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh.json", "shared.json"]


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("not json", "is not JSON"),
        (json.dumps({"tokens": [{"token": "short", "role": "admin"}]}), "at least 8 characters"),
        (json.dumps({"tokens": [{"sha256": "ab" * 31, "role": "admin"}]}), "64 hexadecimal"),
    ],
    ids=["not-json", "short-token", "short-hash"],
)
def test_a_broken_tokens_file_is_not_added_to(tmp_path: Path, content: str, said: str) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(content)
    proc = run_cli(["token", "new", "--role", "admin", "--add", str(path)], tmp_path)
    assert_one_line_error(proc, said)
    assert proc.returncode == 1
    assert path.read_text() == content
    assert proc.stdout == ""  # no token is shown that nothing would accept


@pytest.mark.parametrize(
    ("entry", "said"),
    [
        ({"sha256": "g" * 64, "role": "admin"}, "tokens[1].sha256 must be 64 hexadecimal digits"),
        ({"sha256": "a" * 63, "role": "admin"}, "tokens[1].sha256 must be 64 hexadecimal digits"),
        ({"sha256": 7, "role": "admin"}, "tokens[1].sha256 must be 64 hexadecimal digits"),
        ({"token": 7, "role": "admin"}, "tokens[1].token must be a string"),
        (
            {"sha256": _sha("x" * 20), "token": "x" * 20, "role": "admin"},
            "tokens[1] gives token and sha256: give one of them",
        ),
        (
            {"sha256": _sha(ADMIN).upper(), "role": "consumer"},
            "tokens[1].sha256 is the same secret as tokens[0].token",
        ),
    ],
    ids=[
        "not-hex",
        "short",
        "not-a-string",
        "token-not-a-string",
        "both",
        "same-secret-as-a-plain-one",
    ],
)
def test_sha256_entries_are_checked(entry: dict[str, Any], said: str) -> None:
    from stations.tokens import TokensFileError, parse_tokens

    with pytest.raises(TokensFileError) as refused:
        parse_tokens({"tokens": [{"token": ADMIN, "role": "admin"}, entry]}, "t.json")
    assert str(refused.value).startswith(said), str(refused.value)
    assert ADMIN not in str(refused.value)


@pytest.mark.parametrize(("made_of", "said"), [(b"", "an empty string"), (b"\n", "a lone newline")])
def test_the_hash_of_no_token_is_refused(made_of: bytes, said: str) -> None:
    """``printf %s "$TOKEN" | sha256sum`` with TOKEN unset gives the hash of nothing: such an
    entry let a request with an empty bearer token in, with the entry's role."""
    from stations.tokens import Token, TokensFileError, find, parse_tokens

    hexed = hashlib.sha256(made_of).hexdigest()
    with pytest.raises(TokensFileError) as refused:
        parse_tokens({"tokens": [{"sha256": hexed, "role": "admin"}]}, "t.json")
    assert str(refused.value) == f"tokens[0].sha256 is the hash of {said}, not of a token"
    assert find([Token(bytes.fromhex(hexed), "admin")], "") is None


def test_adds_at_once_all_land(tmp_path: Path) -> None:
    """Each add read the file, then replaced it: of 8 at once, 1 or 2 were kept, and the
    others' tokens (already shown) never worked."""
    from concurrent.futures import ThreadPoolExecutor

    path = tmp_path / "tokens.json"
    with ThreadPoolExecutor(8) as pool:
        made = list(
            pool.map(lambda _: _new(tmp_path, "--role", "consumer", "--add", str(path)), range(8))
        )
    kept = [e["sha256"] for e in json.loads(path.read_text())["tokens"]]
    assert sorted(kept) == sorted(_sha(m["token"]) for m in made)


def test_an_add_goes_through_a_link_and_keeps_the_owner(tmp_path: Path) -> None:
    """A linked tokens file (configuration kept elsewhere) was replaced by a file of its own,
    the real one unchanged; and the file became the adding user's, which a server running as
    its owner could no longer read."""
    import os

    real = tmp_path / "real"
    real.mkdir()
    target = real / "tokens.json"
    target.write_text(json.dumps({"tokens": [{"sha256": _sha(ADMIN), "role": "admin"}]}))
    target.chmod(0o640)
    owner = (65534, 65534) if os.getuid() == 0 else (os.getuid(), os.getgid())
    if os.getuid() == 0:
        os.chown(target, *owner)
    link = tmp_path / "tokens.json"
    link.symlink_to(target)
    made = _new(tmp_path, "--role", "producer", "--add", str(link))
    assert link.is_symlink()
    entries = json.loads(target.read_text())["tokens"]
    assert [e["sha256"] for e in entries] == [_sha(ADMIN), _sha(made["token"])]
    found = target.stat()
    assert (found.st_uid, found.st_gid) == owner
    assert oct(found.st_mode & 0o777) == oct(0o640)


def test_an_empty_file_is_begun(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    path.touch()
    made = _new(tmp_path, "--role", "admin", "--add", str(path))
    assert json.loads(path.read_text()) == {"tokens": [made["entry"]]}


def test_ls_shows_no_secret_and_revoke_takes_the_named_token_only(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    written = "a-written-consumer-token"
    path.write_text(
        json.dumps(
            {
                "tokens": [
                    {"sha256": _sha(ADMIN), "role": "admin"},
                    {"token": written, "role": "consumer", "stations": ["a*"]},
                ]
            }
        )
    )
    listed = run_cli(["token", "ls", str(path), "--json"], tmp_path)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [(r["role"], r["stations"], r["sha256"]) for r in rows] == [
        ("admin", [], _sha(ADMIN)),
        ("consumer", ["a*"], _sha(written)),
    ]
    table = run_cli(["token", "ls", str(path)], tmp_path).stdout
    assert written not in table and _sha(written)[:12] in table
    # A written token is revoked by its hash too; an unknown one, or the last, is refused.
    unknown = run_cli(["token", "revoke", str(path), "--sha256", _sha("nobody-has-it")], tmp_path)
    assert_one_line_error(unknown, "holds no entry of this token")
    assert unknown.returncode == 1
    done = run_cli(["token", "revoke", str(path), "--sha256", _sha(written)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(path.read_text())["tokens"] == [{"sha256": _sha(ADMIN), "role": "admin"}]
    last = clikit.run("token", "revoke", str(path), cwd=tmp_path, stdin=ADMIN + "\n")
    assert_one_line_error(last, "this is the last token of")
    assert json.loads(path.read_text())["tokens"] == [{"sha256": _sha(ADMIN), "role": "admin"}]
    # A file that is also another name's (a hard link) would be replaced by a new file for one
    # name: revoked there, the token still worked for a server reading the other.
    other = tmp_path / "other.json"
    os.link(path, other)
    before = path.read_text()
    linked = run_cli(["token", "revoke", str(path), "--sha256", _sha(ADMIN)], tmp_path)
    assert_one_line_error(linked, "1 other hard link(s)")
    assert linked.returncode == 1
    assert path.read_text() == other.read_text() == before
    bad = run_cli(["token", "revoke", str(path), "--sha256", "xyz"], tmp_path)
    assert_one_line_error(bad, "--sha256 must be 64 hexadecimal digits")
    assert bad.returncode == 2


def test_made_tokens_never_begin_as_an_option() -> None:
    """1 in 64 began with "-": ``stations station ls --token -AbC...`` then took the token
    for an option and failed."""
    from stations.token_edits import new_secret

    made = [new_secret() for _ in range(2000)]
    assert not [t for t in made if t.startswith("-")]
    assert len(set(made)) == len(made) and all(len(t) == 43 for t in made)


def test_a_change_by_hand_meanwhile_refuses_the_change(tmp_path: Path) -> None:
    """The file is read again just before it is replaced: an edit seen then is not lost."""
    from stations.token_edits import _rewrite
    from stations.tokens import TokensFileError

    path = tmp_path / "tokens.json"
    first = {"tokens": [{"sha256": _sha(ADMIN), "role": "admin"}]}
    path.write_text(json.dumps(first))
    by_hand = {"tokens": [*first["tokens"], {"sha256": _sha("x" * 20), "role": "consumer"}]}

    def edited_meanwhile(entries: list[Any]) -> None:
        entries.append({"sha256": _sha("y" * 20), "role": "producer"})
        path.write_text(json.dumps(by_hand))  # another hand, between the read and the replace

    with pytest.raises(TokensFileError) as refused:
        _rewrite(str(path), edited_meanwhile, "the entry was added")
    assert "changed while the entry was added" in str(refused.value)
    assert json.loads(path.read_text()) == by_hand
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokens.json"]


def test_revoke_without_a_token_and_backup_without_dest_are_usage_errors(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"tokens": [{"sha256": _sha(ADMIN), "role": "admin"}]}))
    nothing = clikit.run("token", "revoke", str(path), cwd=tmp_path, stdin="\n")
    assert_one_line_error(nothing, "no token on standard input (or give --sha256)")
    assert nothing.returncode == 2
    empty = run_cli(["backup", ""], tmp_path)
    assert_one_line_error(empty, "DEST is empty")
    assert empty.returncode == 2
