"""A blocking facade over the async SDK, for scripts and notebooks.

``SyncClient`` runs a private event loop in a daemon thread and forwards every call to it: an
async method becomes a blocking one, an async iterator (readers, consumers) a plain iterator, an
async context manager a plain one, and SDK objects it returns (``Station``,
``IdempotentProducer``, ``Consumer``, ``Message``, ...) come back wrapped the same way. Nothing
else is reimplemented, so the async API's documentation applies as is.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import functools
import inspect
import logging
import os
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from stations.client.client import Client
from stations.client.http import DEFAULT_URL
from stations.client.retry import DEFAULT_RETRY, RetryPolicy

logger = logging.getLogger("stations.client.sync")

_SDK_MODULE = "stations.client."
# How long a SyncClient left open is given to close at interpreter exit (flush its producers,
# send its acks): a script that ends without close() must not hang for ever on a server down.
EXIT_TIMEOUT = 30.0


class _Loop:
    def __init__(self) -> None:
        self.closed = False
        # The thread closing this client at interpreter exit (see SyncClient._close_at_exit).
        self.exiting: int | None = None
        # Held from the ``closed`` check to the submission in run(), and to set ``closed``: a
        # call that passed the check just before close() was submitted after the cancelling
        # of pending calls, or onto the stopped loop, and its caller waited forever.
        self._lock = threading.Lock()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="stations-sync", daemon=True
        )
        self.thread.start()

    def run(self, make: Callable[[], Any], timeout: float | None = None) -> Any:
        """Call ``make()`` on the loop's thread (``append()`` needs the running loop there) and
        await its result if it is awaitable (``timeout``: then ``TimeoutError``, the call
        cancelled)."""
        if threading.get_ident() == self.thread.ident:
            # A callback run by the SDK (on_error) is on the loop's thread: waiting there for
            # the loop would wait forever.
            raise RuntimeError(
                "a blocking SyncClient call from the client's own event loop thread (inside "
                "a callback such as on_error) would wait for itself; hand the work to "
                "another thread"
            )

        async def call() -> Any:
            result = make()
            return await result if inspect.isawaitable(result) else result

        try:
            with self._lock:
                if self.closed:
                    raise RuntimeError("the SyncClient is closed")
                future = asyncio.run_coroutine_threadsafe(call(), self.loop)
            return self._result(future, timeout)
        except BaseException:
            if self.exiting not in (None, threading.get_ident()):
                # A daemon thread (the only ones left at exit) in a call, a live read say:
                # closed at exit, it printed a traceback where it used to be stopped quietly
                # with the interpreter. It waits for that, as before.
                threading.Event().wait()
            raise

    def _result(self, future: concurrent.futures.Future[Any], timeout: float | None) -> Any:
        try:
            return future.result(timeout)
        except concurrent.futures.CancelledError:
            if self.closed:
                raise RuntimeError("the SyncClient was closed while this call waited") from None
            raise
        except BaseException:
            # Interrupted (Ctrl-C in a script or a notebook): the call must not run on behind
            # the caller's back, a fetch leasing messages nobody receives, a read's generator
            # still running under the next call. The task's cancellation is queued on the
            # loop before anything a later call queues, so it ends first.
            future.cancel()
            raise

    def cancel_pending(self) -> None:
        """Cancel what still runs on the loop (calls other threads wait in: a long-poll, a
        consumer's iteration), so that they end with an error instead of waiting forever on a
        stopped loop."""
        with self._lock:
            self.closed = True

        async def cancel() -> None:
            current = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not current]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(concurrent.futures.TimeoutError):
            asyncio.run_coroutine_threadsafe(cancel(), self.loop).result(5)

    def stop(self) -> None:
        with self._lock:
            self.closed = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


_ASYNC_API: dict[type, bool] = {}


def _has_async_api(cls: type) -> bool:
    if cls not in _ASYNC_API:
        _ASYNC_API[cls] = hasattr(cls, "__aiter__") or bool(
            inspect.getmembers(cls, inspect.iscoroutinefunction)
        )
    return _ASYNC_API[cls]


def _wrap(loop: _Loop, value: Any) -> Any:
    """SDK objects with async methods come back blocking, in a list too (``fetch()``'s
    messages: unwrapped, ``msg.ack()`` made a coroutine nobody awaited, and the ack was never
    sent); results (dataclasses) as they are."""
    if isinstance(value, list):
        return [_wrap(loop, item) for item in value]
    if type(value).__module__.startswith(_SDK_MODULE) and _has_async_api(type(value)):
        return Blocking(loop, value)
    return value


def _unwrap(value: Any) -> Any:
    """An argument as the SDK takes it: a blocking view passed back (a message given to
    ``consumer.extend([msg])``) is its SDK object again, whose methods the SDK calls on its
    own event loop (through the view they would wait for themselves)."""
    if isinstance(value, Blocking):
        return value._target
    # A list or tuple of views (a tuple passed them on to the SDK's own loop); other
    # sequences, a NamedTuple among them, as they are (rebuilding one from a generator failed).
    if type(value) is list:
        return [_unwrap(item) for item in value]
    if type(value) is tuple:
        return tuple(_unwrap(item) for item in value)
    return value


class Blocking:
    """A blocking view of one SDK object."""

    def __init__(self, loop: _Loop, target: Any) -> None:
        self._loop = loop
        self._target = target

    def __repr__(self) -> str:
        return f"Blocking({self._target!r})"

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if not callable(attr):
            # An SDK object reached as an attribute (``consumer.station``) is blocking too:
            # its methods returned coroutines nobody awaited, and nothing was stored.
            return _wrap(self._loop, attr)

        def call(*args: Any, **kwargs: Any) -> Any:
            args = tuple(_unwrap(a) for a in args)
            kwargs = {k: _unwrap(v) for k, v in kwargs.items()}
            return _wrap(self._loop, self._loop.run(lambda: attr(*args, **kwargs)))

        return call

    def __iter__(self) -> Iterator[Any]:
        iterator = self._target.__aiter__()
        while True:
            try:
                item = self._loop.run(lambda: _next(iterator))
            except StopAsyncIteration:
                return
            yield _wrap(self._loop, item)

    def __enter__(self) -> Blocking:
        self._loop.run(self._target.__aenter__)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._loop.run(lambda: self._target.__aexit__(*exc))


def _next(iterator: Any) -> Awaitable[Any]:
    step: Awaitable[Any] = iterator.__anext__()
    return step


class SyncClient(Blocking):
    """``Client`` with blocking methods: ``with SyncClient(url) as client: ...``."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        retry: RetryPolicy = DEFAULT_RETRY,
    ):
        # No ``session``: an aiohttp session belongs to the event loop it was made on, and
        # this client's loop runs in a thread of its own.
        loop = _Loop()
        try:
            client = loop.run(lambda: Client(url, token, timeout=timeout, retry=retry))
        except BaseException:
            # Refused arguments (a URL without http://): nothing else would stop the thread.
            loop.stop()
            raise
        super().__init__(loop, client)
        # Threads that close it at once (each worker at its end): one closes, the others wait
        # for that and return. Unguarded, a second close() ran on and raised from the loop the
        # first one had stopped.
        self._close_lock = threading.Lock()
        # Left open, it is closed at interpreter exit: its loop runs in a daemon thread, which
        # exit stopped with the producers' queued batches unsent (lost without a word) and
        # the session open. Through a weak reference: the hook keeps no client alive, and
        # goes when the client does.
        self._pid = os.getpid()
        self._exit_hook = _exit_hook(self)
        atexit.register(self._exit_hook)

    def close(self) -> None:
        """Flush and close (see ``Client.close``), then end calls other threads still wait in
        (they raise ``RuntimeError``) and stop the loop."""
        atexit.unregister(self._exit_hook)
        with self._close_lock:
            if self._loop.closed:
                return
            self._close()

    def _close_at_exit(self) -> None:
        """``close()`` at interpreter exit, waiting at most ``EXIT_TIMEOUT``."""
        if os.getpid() != self._pid:
            return  # a forked child: the loop's thread is the parent's
        if not self._close_lock.acquire(timeout=EXIT_TIMEOUT):
            return  # another thread is closing it and stuck: exit all the same
        try:
            if self._loop.closed:
                return
            self._loop.exiting = threading.get_ident()
            try:
                self._close(timeout=EXIT_TIMEOUT)
            except Exception as exc:
                logger.warning("closing a SyncClient left open at exit failed: %r", exc)
        finally:
            self._close_lock.release()

    def _close(self, timeout: float | None = None) -> None:
        try:
            self._loop.run(self._target.close, timeout)
        finally:
            self._loop.cancel_pending()
            # A cancelled retry may have opened a new session after close(): close it too.
            http_close = self._target.http.close()
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(http_close, self._loop.loop).result(5)
            self._loop.stop()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _exit_hook(client: SyncClient) -> Callable[[], None]:
    """An atexit hook closing ``client`` if it is still there; unregistered when it is
    collected, so that hooks do not pile up for clients long gone."""

    def forget(_: object) -> None:
        atexit.unregister(hook)

    hook = functools.partial(_close_if_alive, weakref.ref(client, forget))
    return hook


def _close_if_alive(ref: weakref.ref[SyncClient]) -> None:
    client = ref()
    if client is not None:
        client._close_at_exit()
