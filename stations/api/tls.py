"""TLS served by the process itself (``--tls-cert``, ``--tls-key``), for a deployment with no
TLS-terminating proxy in front.

One ``ssl.SSLContext`` serves every connection; SIGHUP loads the files into it again, so a
renewed certificate is taken without a restart: connections made after it get the new one,
open connections keep theirs."""

from __future__ import annotations

import ssl


class TlsFilesError(Exception):
    """The certificate or key cannot be used; the message names the option."""


def server_context(cert: str, key: str | None) -> ssl.SSLContext:
    """A server context holding ``cert`` (PEM, the chain after the certificate) and ``key``
    (PEM; None: the key is in ``cert``'s file). TLS 1.2 at least, Python's default ciphers."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    load(context, cert, key)
    return context


def reload(context: ssl.SSLContext, cert: str, key: str | None) -> None:
    """Load the files again into the context in use (SIGHUP). They are tried on a new context
    first: a key that does not match the certificate fails in OpenSSL after it has taken the
    certificate, and the context in use would be left holding the pair that fails every
    handshake. On failure it keeps what it held."""
    server_context(cert, key)
    load(context, cert, key)


def load(context: ssl.SSLContext, cert: str, key: str | None) -> None:
    # OpenSSL's own errors name no file (a missing one is FileNotFoundError without a name).
    for option, path in (("--tls-cert", cert), ("--tls-key", key)):
        if path is None:
            continue
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise TlsFilesError(f"{option}: cannot read {path}: {exc.strerror}") from None
    try:
        context.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        files = cert if key is None else f"{cert} and {key}"
        reason = getattr(exc, "reason", None) or exc.strerror or str(exc)
        raise TlsFilesError(
            f"--tls-cert/--tls-key: {files} hold no usable certificate and matching private "
            f"key in PEM ({reason})"
        ) from None
