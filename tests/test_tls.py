"""HTTPS served by the process itself (``--tls-cert``, ``--tls-key``): the API, the SDK and the
CLI over it, a renewed certificate taken on SIGHUP (and a broken one refused, keeping the one
in use), unusable files refused at start naming the option, and a TLS handshake held open
closed as a slow request head is. Real certificates, signed by a test authority made here."""

from __future__ import annotations

import datetime
import http.client
import ipaddress
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from stations.client import Client
from tests.harness import Server, free_port


@dataclass(frozen=True)
class Leaf:
    cert: bytes  # PEM
    key: bytes  # PEM
    der: bytes  # what a client sees as the server's certificate


class Authority:
    """A certificate authority of the test's own, which signs certificates for 127.0.0.1."""

    def __init__(self) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "stations test CA")])
        now = datetime.datetime.now(datetime.UTC)
        self.name = name
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )
        self.pem = self.cert.public_bytes(serialization.Encoding.PEM)

    def leaf(self) -> Leaf:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(self.name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(
                x509.SubjectAlternativeName(
                    [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
                ),
                critical=False,
            )
            .sign(self.key, hashes.SHA256())
        )
        return Leaf(
            cert=cert.public_bytes(serialization.Encoding.PEM),
            key=key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
            der=cert.public_bytes(serialization.Encoding.DER),
        )


@dataclass
class Tls:
    authority: Authority
    first: Leaf
    ca_file: Path
    cert_file: Path
    key_file: Path

    def install(self, leaf: Leaf, key: bytes | None = None) -> None:
        """Put ``leaf`` (with ``key``, else its own) where the server reads its files."""
        self.cert_file.write_bytes(leaf.cert)
        self.key_file.write_bytes(leaf.key if key is None else key)

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))


@pytest.fixture
def tls(tmp_path: Path) -> Tls:
    authority = Authority()
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(authority.pem)
    found = Tls(authority, authority.leaf(), ca_file, tmp_path / "cert.pem", tmp_path / "key.pem")
    found.install(found.first)
    return found


@pytest.fixture
def srv(tmp_path: Path, tls: Tls) -> Iterator[Server]:
    args = ["--tls-cert", str(tls.cert_file), "--tls-key", str(tls.key_file)]
    server = Server(
        f"sqlite:///{tmp_path / 'db.sqlite'}",
        tmp_path,
        args=[*args, "--head-timeout-s", "2", "--log-level", "info"],
    )
    server.start()
    yield server
    server.stop()


def _https(srv: Server) -> str:
    return f"https://127.0.0.1:{srv.port}"


def _served_certificate(srv: Server, context: ssl.SSLContext) -> bytes:
    with (
        socket.create_connection(("127.0.0.1", srv.port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls_socket,
    ):
        der = tls_socket.getpeercert(binary_form=True)
    assert der is not None
    return der


def _request(
    srv: Server, tls: Tls, method: str, path: str, body: bytes | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPSConnection("127.0.0.1", srv.port, context=tls.context(), timeout=10)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        answer = conn.getresponse()
        return answer.status, dict(answer.getheaders()), answer.read()
    finally:
        conn.close()


def test_the_api_is_served_over_https_and_plain_http_gets_no_answer(srv: Server, tls: Tls) -> None:
    status, headers, _ = _request(srv, tls, "PUT", "/v1/stream/orders", b"")
    assert status == 201
    # The stream's own address says https: clients follow it.
    assert headers["Location"] == f"{_https(srv)}/v1/stream/orders"
    assert _request(srv, tls, "POST", "/v1/stream/orders", b'{"n": 1}')[0] == 204
    status, _, body = _request(srv, tls, "GET", "/v1/stream/orders?offset=-1")
    assert (status, json.loads(body)) == (200, [{"n": 1}])
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    with pytest.raises((http.client.HTTPException, ConnectionError)):
        conn.request("GET", "/healthz")
        conn.getresponse()
    conn.close()


async def test_the_sdk_reaches_it_with_a_session_that_trusts_its_authority(
    srv: Server, tls: Tls
) -> None:
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls.context()))
    async with Client(_https(srv), session=session) as client:
        await client.create_station("sdk")
        await client.station("sdk").produce({"n": 7})
        batch = await client.station("sdk").browse()
        assert [m.data for m in batch.messages] == [{"n": 7}]
    await session.close()


def _cli(srv: Server, env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "stations", *argv, "--url", _https(srv)]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)


def test_the_cli_trusts_the_authority_ssl_cert_file_names(srv: Server, tls: Tls) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("SSL_CERT_FILE", "SSL_CERT_DIR")}
    refused = _cli(srv, env, "station", "create", "cli")
    assert refused.returncode != 0
    assert "certificate" in refused.stderr, refused.stderr
    done = _cli(srv, {**env, "SSL_CERT_FILE": str(tls.ca_file)}, "station", "create", "cli")
    assert done.returncode == 0, done.stderr
    listed = _cli(srv, {**env, "SSL_CERT_FILE": str(tls.ca_file)}, "station", "ls")
    assert "cli" in listed.stdout, listed.stdout + listed.stderr


def _log(srv: Server) -> str:
    return (srv.workdir / f"server-{srv.port}.log").read_text(errors="replace")


def _wait_for_log(srv: Server, text: str, seen: int) -> None:
    """Until ``text`` is logged after the log's first ``seen`` characters."""
    deadline = time.monotonic() + 10
    while text not in _log(srv)[seen:]:
        assert time.monotonic() < deadline, f"{text!r} not logged: {_log(srv)[-1500:]}"
        time.sleep(0.05)


def test_sighup_takes_a_renewed_certificate_and_keeps_it_over_a_broken_one(
    srv: Server, tls: Tls
) -> None:
    assert srv.proc is not None
    assert _served_certificate(srv, tls.context()) == tls.first.der
    renewed = tls.authority.leaf()
    tls.install(renewed)
    seen = len(_log(srv))
    srv.proc.send_signal(signal.SIGHUP)
    _wait_for_log(srv, "certificate read from", seen)
    assert _served_certificate(srv, tls.context()) == renewed.der
    # A key that is not the certificate's: OpenSSL took the certificate before it refused
    # the key, which would have left the pair in use failing every handshake.
    tls.install(tls.authority.leaf(), key=tls.first.key)
    seen = len(_log(srv))
    srv.proc.send_signal(signal.SIGHUP)
    _wait_for_log(srv, "the certificate in use is kept", seen)
    assert _served_certificate(srv, tls.context()) == renewed.der
    assert _request(srv, tls, "GET", "/healthz")[0] == 200


def test_a_handshake_never_begun_is_closed_like_a_slow_request_head(srv: Server) -> None:
    with socket.create_connection(("127.0.0.1", srv.port), timeout=15) as raw:
        started = time.monotonic()
        assert raw.recv(100) == b""  # closed by the server (--head-timeout-s 2)
        assert time.monotonic() - started < 10


@pytest.mark.parametrize(
    "case",
    [
        "no cert file",
        "no key file",
        "key without cert",
        "not a certificate",
        "wrong key",
        "encrypted key",
        "empty cert",
    ],
)
def test_unusable_tls_files_stop_the_start_naming_the_option(
    tmp_path: Path, tls: Tls, case: str
) -> None:
    other = tls.authority.leaf()
    missing = str(tmp_path / "missing.pem")
    args = {
        "no cert file": ["--tls-cert", missing],
        "no key file": ["--tls-cert", str(tls.cert_file), "--tls-key", missing],
        "key without cert": ["--tls-key", str(tls.key_file)],
        "not a certificate": ["--tls-cert", str(tls.key_file)],
        "encrypted key": ["--tls-cert", str(tls.cert_file), "--tls-key", str(tmp_path / "enc.pem")],
        "empty cert": ["--tls-cert", ""],
        "wrong key": ["--tls-cert", str(tls.cert_file), "--tls-key", str(tmp_path / "other.pem")],
    }[case]
    (tmp_path / "other.pem").write_bytes(other.key)
    # The test's own key, encrypted: OpenSSL asked for its passphrase on the terminal.
    key = serialization.load_pem_private_key(tls.first.key, None)
    encrypted = serialization.BestAvailableEncryption(b"passphrase")
    (tmp_path / "enc.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encrypted)
    )
    command = [sys.executable, "-m", "stations", "serve", "--port", str(free_port())]
    command += ["--db", f"sqlite:///{tmp_path / 'db.sqlite'}", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    keyed = ("no key file", "key without cert", "encrypted key")
    option = "--tls-key" if case in keyed else "--tls-cert"
    assert option in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_connections_in_their_handshake_count_against_max_connections(
    tmp_path: Path, tls: Tls
) -> None:
    """Served by ``create_server(ssl=...)``, a connection joined the count only once its
    handshake was done: 60 connections that never began one held 60 descriptors past a cap
    of 4 (plain HTTP held 4), each up to the handshake timeout."""
    args = ["--tls-cert", str(tls.cert_file), "--tls-key", str(tls.key_file)]
    args += ["--max-connections", "4"]
    server = Server(f"sqlite:///{tmp_path / 'cap.sqlite'}", tmp_path, args)
    server.start()
    assert server.proc is not None
    fds = Path(f"/proc/{server.proc.pid}/fd")
    try:
        before = len(list(fds.iterdir()))
        idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(60)]
        time.sleep(1)
        held = len(list(fds.iterdir())) - before
        assert held <= 8, f"{held} descriptors held for 60 idle connections, cap 4"
        # Over the cap a client is dropped; once the idle ones leave, it is served again.
        with pytest.raises(OSError):  # ssl.SSLError and ConnectionError are OSErrors
            _served_certificate(server, tls.context())
        for sock in idle:
            sock.close()
        deadline = time.monotonic() + 10
        while True:
            try:
                assert _served_certificate(server, tls.context()) == tls.first.der
                break
            except OSError:
                assert time.monotonic() < deadline, "not served after the idle ones left"
                time.sleep(0.1)
    finally:
        server.stop()
