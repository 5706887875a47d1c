"""The README's ``curl`` blocks, run in order against one fresh ``stations serve``: every
command succeeds (curl fails on any HTTP error here), and each answer the README shows in the
comments under a command is the answer the server gives."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.harness import Server

ROOT = Path(__file__).parent.parent


@dataclass
class Command:
    line: str
    shown: list[str] = field(default_factory=list)  # the answer the README shows, if any


def curl_commands() -> list[Command]:
    text = (ROOT / "README.md").read_text()
    commands: list[Command] = []
    for block in re.findall(r"^```sh\n(.*?)^```", text, flags=re.S | re.M):
        if not re.search(r"^curl ", block, flags=re.M):
            continue
        lines = block.replace("\\\n", " ").splitlines()
        answering = False  # an answer is the comment lines right under its command
        for line in lines:
            if not line.strip():
                answering = False
            elif line.split("#", 1)[0].rstrip().endswith("&"):
                # A process the block starts in the background (a server, a receiver): the
                # test's own server stands in, and nothing is left running after the test.
                answering = False
            elif not line.startswith("#"):
                commands.append(Command(line))  # curl, or any other command in the block
                answering = True
            elif (
                answering
                and commands
                and (commands[-1].shown or line[2:3] in "{[" or line.startswith("# HTTP/"))
            ):
                commands[-1].shown.append(line[2:])
            else:
                answering = False
    return commands


def test_readme_has_curl_examples() -> None:
    commands = curl_commands()
    assert len(commands) >= 6
    assert sum(1 for c in commands if c.shown) >= 3


def _check_answer(command: Command, out: str) -> None:
    shown = command.shown
    if shown[0].startswith("HTTP/"):
        head = out.replace("\r\n", "\n").split("\n\n", 1)[0].splitlines()
        assert head[0].strip() == shown[0], (command.line, head)
        headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:])}
        for line in shown[1:]:
            name, _, value = line.partition(":")
            assert headers.get(name.strip().lower()) == value.strip(), (command.line, line, headers)
    else:
        assert json.loads(out) == json.loads(" ".join(shown)), (command.line, out)


def test_readme_curl_blocks_run_in_order(make_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    if shutil.which("curl") is None:
        pytest.fail("curl is needed to run the README's examples")
    # As the subscriptions block starts it: loopback webhooks allowed (development only).
    server: Server = make_server(f"sqlite:///{tmp_path / 'readme.db'}", "--webhooks-allow-loopback")
    host = server.url.removeprefix("http://")
    for command in curl_commands():
        line = command.line.replace("localhost:4437", host)
        # The README's commands as written; only --fail-with-body and -sS are added, so any 4xx
        # (such as a 409 from creating a station twice) fails the test.
        script = f'curl() {{ command curl -sS --fail-with-body "$@"; }}\n{line}'
        proc = subprocess.run(
            ["bash", "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path
        )
        assert proc.returncode == 0, (command.line, proc.stdout, proc.stderr)
        if command.shown:
            _check_answer(command, proc.stdout)
