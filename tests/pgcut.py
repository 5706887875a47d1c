"""A TCP proxy in front of PostgreSQL that can lose a connection during its COMMIT, as a network
cut, a failover or a load balancer's idle timeout would: the COMMIT reaches PostgreSQL, which
commits, and its answer never reaches the server. Also refuses new connections for a while
(the database unreachable afterwards). Runs its own event loop on a thread; speaks just enough
of the wire protocol to find message boundaries (connect with ``sslmode=disable``)."""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
import time

SSL_REQUEST = 80877103


class CommitCutter:
    def __init__(self, upstream_port: int = 5432) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.cuts = 0
        self._marker: bytes | None = None
        self._refuse_until = 0.0
        self._then_refuse_s = 0.0
        self._forward = True
        self._held: list[asyncio.StreamWriter] = []
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._started.wait(5)

    def url(self, database_url: str) -> str:
        """``database_url`` (a PostgreSQL URL on the upstream port) through this proxy."""
        base, name = database_url.rsplit("/", 1)
        host = base.rsplit(":", 1)[0]
        return f"{host}:{self.port}/{name}?sslmode=disable"

    def arm(self, marker: str, then_refuse_s: float = 0.0, *, forward: bool = True) -> None:
        """Cut the connection at the next COMMIT of a transaction whose traffic holds
        ``marker``, once PostgreSQL has answered it (``forward``) or before it reached
        PostgreSQL (not ``forward``: its server process waits on, the transaction open); then
        close new connections at once for ``then_refuse_s`` seconds (the database
        unreachable)."""
        self._marker = marker.encode()
        self._then_refuse_s = then_refuse_s
        self._forward = forward

    def close(self) -> None:
        async def shut() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._loop.stop()

        asyncio.run_coroutine_threadsafe(shut(), self._loop)
        self._thread.join(5)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._started.set()
        self._loop.run_forever()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if time.monotonic() < self._refuse_until:
            client_w.transport.abort()
            return
        server_r, server_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        answered = asyncio.Event()
        cutting = False

        async def downstream() -> None:
            with contextlib.suppress(Exception):
                while data := await server_r.read(65536):
                    if cutting:  # PostgreSQL answered the COMMIT: the answer is lost
                        answered.set()
                        return
                    client_w.write(data)
                    await client_w.drain()
            client_w.close()

        task = asyncio.ensure_future(downstream())
        buffer, since, started = b"", b"", False
        try:
            while data := await client_r.read(65536):
                buffer += data
                out = b""
                while True:
                    if not started:  # startup messages: a length, no type byte
                        if len(buffer) < 4 or len(buffer) < struct.unpack("!I", buffer[:4])[0]:
                            break
                        n = struct.unpack("!I", buffer[:4])[0]
                        message, buffer = buffer[:n], buffer[n:]
                        started = struct.unpack("!I", message[4:8])[0] != SSL_REQUEST
                        out += message
                        continue
                    if len(buffer) < 5 or len(buffer) < 1 + struct.unpack("!I", buffer[1:5])[0]:
                        break
                    n = 1 + struct.unpack("!I", buffer[1:5])[0]
                    message, buffer = buffer[:n], buffer[n:]
                    commit = message[:1] in (b"Q", b"P") and b"COMMIT" in message[5:45].upper()
                    marker = self._marker
                    if commit and marker is not None and marker in since:
                        self._marker = None
                        cutting = True
                        if self._forward:
                            server_w.write(out + message)
                            await server_w.drain()
                            with contextlib.suppress(TimeoutError):
                                await asyncio.wait_for(answered.wait(), 5)
                        else:  # PostgreSQL's side stays open, idle in its transaction
                            server_w.write(out)
                            await server_w.drain()
                            self._held.append(server_w)
                        self.cuts += 1
                        self._refuse_until = time.monotonic() + self._then_refuse_s
                        client_w.transport.abort()
                        return
                    since = b"" if commit else since + message
                    out += message
                if out:
                    server_w.write(out)
                    await server_w.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            if server_w not in self._held:
                server_w.close()
            client_w.close()
            task.cancel()
