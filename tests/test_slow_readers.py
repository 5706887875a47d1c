"""Clients that stop reading cannot starve the others (the reviews of 2026-11-27).

A catch-up page is held, and counted in the read budget, until its client has taken it; a
handful of connections that ask for pages and never read them held the whole budget, and every
other read, of every station and token, waited 10 s and was refused 503 for as long as the
send timeout (30 s), again each time they reconnected. Now, while reads wait for read memory,
connections whose client has not read for a second are closed, as a broker drops a slow
consumer."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.harness import Server

OCTETS = {"Content-Type": "application/octet-stream"}


@pytest.fixture
def srv(make_server, tmp_path) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    yield make_server(f"sqlite:///{tmp_path}/slow.db", "--read-budget-mb", "8")


def test_clients_that_stop_reading_do_not_starve_other_reads(srv: Server) -> None:
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        assert http.put("/v1/stream/big", headers=OCTETS).status_code == 201
        blob = b"x" * (1 << 20)
        for _ in range(12):
            assert http.post("/v1/stream/big", headers=OCTETS, content=blob).status_code == 204
        silent = []
        for k in range(6):  # each asks for pages of up to 4 MiB and reads nothing
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(("127.0.0.1", srv.port))
            offset = f"{k:016d}_{0:016d}"
            s.sendall(
                f"GET /v1/stream/big?offset={offset} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
            )
            silent.append(s)
        try:
            time.sleep(1.5)  # their pages are in, the budget spent
            started = time.monotonic()
            r = http.get("/v1/stream/big", params={"offset": "-1"})
            waited = time.monotonic() - started
            assert r.status_code == 200, (r.status_code, r.text[:200])
            assert len(r.content) >= 1 << 20
            assert waited < 5, f"a read waited {waited:.1f} s behind clients that read nothing"
            r = http.get("/v1/stream/big", params={"offset": "-1", "live": "long-poll"})
            assert r.status_code == 200, (r.status_code, r.text[:200])
            # The server closed (reset) the connections of the clients that read nothing.
            # (What their sockets held is read first; a connection still open ends in a wait.)
            reset = 0
            for s in silent:
                s.settimeout(0.5)
                try:
                    while s.recv(1 << 16):
                        pass
                    reset += 1
                except ConnectionResetError:
                    reset += 1
                except TimeoutError:
                    pass
            assert reset >= 1
            closed = {
                sample.labels["reason"]: sample.value
                for family in text_string_to_metric_families(http.get("/metrics").text)
                if family.name == "stations_connections_closed"
                for sample in family.samples
                if sample.name.endswith("_total")
            }
            assert closed["slow_client"] >= reset, closed
            assert closed["send_timeout"] == 0, closed
        finally:
            for s in silent:
                s.close()
