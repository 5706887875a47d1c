"""TLS served by the process itself (``--tls-cert``, ``--tls-key``), for a deployment with no
TLS-terminating proxy in front.

One ``ssl.SSLContext`` serves every connection; SIGHUP loads the files into it again, so a
renewed certificate is taken without a restart: connections made after it get the new one,
open connections keep theirs."""

from __future__ import annotations

import os
import ssl
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager


class TlsFilesError(Exception):
    """The certificate or key cannot be used; the message names the option."""


def server_context(cert: str, key: str | None) -> ssl.SSLContext:
    """A server context holding ``cert`` (PEM, the chain after the certificate) and ``key``
    (PEM; None: the key is in ``cert``'s file). TLS 1.2 at least, Python's default ciphers."""
    context = _new()
    with _snapshot(cert, key) as pem:
        _load(context, pem, cert, key)
    return context


def reload(context: ssl.SSLContext, cert: str, key: str | None) -> None:
    """Load the files again into the context in use (SIGHUP); on failure it keeps what it held.

    They are read once, and tried on a new context before the one in use takes the same
    bytes: a key that is not the certificate's fails in OpenSSL after it has taken the
    certificate, which would leave the context in use failing every handshake, and files
    read twice could change in between (a renewal writing the certificate, then the key)."""
    with _snapshot(cert, key) as pem:
        _load(_new(), pem, cert, key)
        _load(context, pem, cert, key)


def _new() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


@contextmanager
def _snapshot(cert: str, key: str | None) -> Iterator[str]:
    """The certificate and key as read now, in one private file that lives for the block
    (OpenSSL loads them from paths only)."""
    parts = [_read(cert, "--tls-cert")]
    if key is not None:
        parts.append(_read(key, "--tls-key"))
    fd, path = tempfile.mkstemp(prefix="stations-tls-", suffix=".pem")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(b"\n".join(parts))
        yield path
    finally:
        os.unlink(path)


def _read(path: str, option: str) -> bytes:
    # OpenSSL's own errors name no file (a missing one is FileNotFoundError without a name).
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise TlsFilesError(f"{option}: cannot read {path}: {exc.strerror}") from None


def _no_passphrase() -> str:
    # Called by OpenSSL for an encrypted key: it would otherwise ask on the terminal, with the
    # event loop stopped until someone answered.
    raise TlsFilesError("--tls-key: the key is encrypted; give it unencrypted (mode 0600)")


def _load(context: ssl.SSLContext, pem: str, cert: str, key: str | None) -> None:
    try:
        context.load_cert_chain(pem, password=_no_passphrase)
    except TlsFilesError:
        raise
    except (ssl.SSLError, OSError) as exc:
        files = cert if key is None else f"{cert} and {key}"
        reason = getattr(exc, "reason", None) or exc.strerror or str(exc)
        raise TlsFilesError(
            f"--tls-cert/--tls-key: {files} hold no usable certificate and matching private "
            f"key in PEM ({reason})"
        ) from None
