"""The README's webhook receiver (section "Subscriptions") runs unchanged: it accepts a real,
signed wake from ``stations serve`` and acks it, and refuses a request whose body was changed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.harness import Server, free_port

ROOT = Path(__file__).parent.parent
SECTION = "## Subscriptions"


def receiver_code() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(SECTION)
    end = min(i for i in (text.find("\n## ", start), text.find("\n### ", start + 1)) if i > 0)
    (code,) = re.findall(r"^```python\n(.*?)^```", text[start:end], flags=re.S | re.M)
    return code


def test_readme_webhook_receiver(make_server: Any, tmp_path: Path) -> None:
    server: Server = make_server(f"sqlite:///{tmp_path / 'r.db'}", "--webhooks-allow-loopback")
    port = free_port()
    script = tmp_path / "webhook_receiver.py"
    script.write_text(receiver_code())
    out = tmp_path / "receiver.log"
    env = {**os.environ, "STATIONS_URL": server.url, "PORT": str(port)}
    with open(out, "wb") as log:
        proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=log, stderr=log)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            hook = f"http://127.0.0.1:{port}/hook"
            deadline = time.monotonic() + 20
            while True:  # until the receiver listens
                try:
                    httpx.post(hook, content=b"{}", timeout=2)
                    break
                except httpx.TransportError:
                    assert proc.poll() is None and time.monotonic() < deadline, out.read_text()
                    time.sleep(0.1)
            # unsigned and tampered requests are refused
            assert httpx.post(hook, content=b"{}").status_code == 401
            r = client.put(
                "/v1/stream/__ds/subscriptions/billing",
                json={"type": "webhook", "pattern": "orders/*", "webhook": {"url": hook}},
            )
            assert r.status_code == 201, r.text
            client.put("/v1/stream/orders/eu", json={"total": 12})
            tail = client.head("/v1/stream/orders/eu").headers["Stream-Next-Offset"]
            while True:
                streams = client.get("/v1/stream/__ds/subscriptions/billing").json()["streams"]
                if any(s["path"] == "orders/eu" and s["acked_offset"] == tail for s in streams):
                    break
                assert time.monotonic() < deadline + 20, out.read_text()
                time.sleep(0.05)
            assert f"orders/eu: 0000000000000000_0000000000000000 -> {tail}" in out.read_text()
    finally:
        proc.terminate()
        proc.wait(10)


def test_receiver_refuses_a_changed_body(make_server: Any, tmp_path: Path) -> None:
    """A signature made by the server does not carry over to another body."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    namespace: dict[str, Any] = {}
    # the receiver's functions, without fetching keys or serving
    code = receiver_code().split("\napp = web.Application()")[0]
    code = code.replace("\nKEYS = load_keys()", "\n")
    exec(compile(code, "webhook_receiver.py", "exec"), namespace)
    key = Ed25519PrivateKey.generate()
    namespace["KEYS"] = {"k1": key.public_key()}
    t = str(int(time.time()))
    body = b'{"subscription_id": "a"}'
    import base64

    sig = base64.urlsafe_b64encode(key.sign(t.encode() + b"." + body)).rstrip(b"=").decode()
    header = f"t={t},kid=k1,ed25519={sig}"
    assert namespace["verified"](body, header)
    assert not namespace["verified"](body.replace(b'"a"', b'"b"'), header)
    assert not namespace["verified"](body, header.replace("kid=k1", "kid=k2"))
    old = str(int(t) - 600)
    sig_old = base64.urlsafe_b64encode(key.sign(old.encode() + b"." + body)).rstrip(b"=").decode()
    assert not namespace["verified"](body, f"t={old},kid=k1,ed25519={sig_old}")
