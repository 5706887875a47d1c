"""Ed25519 keys for subscriptions: webhook signatures (PROTOCOL.md §7.1), the JWKS that
publishes their public halves (§6.5), and the wake tokens that callbacks, acks and releases
present (§12.9).

The crypto is the ``cryptography`` package's; JWK export, thumbprints and the token (a JWT
signed with EdDSA) are ``joserfc``'s. Private keys live in the database (``ds_signing_keys``),
so every process of a PostgreSQL deployment signs with the same key and a restart keeps it.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from joserfc import jwt
from joserfc.jwk import KeySet, OKPKey

TOKEN_LIFETIME_S = 24 * 3600  # generation fencing, not expiry, is what ends a token's use
ALG = "EdDSA"  # the JWKS entry's alg, as the protocol shows it
TOKEN_ALG = "Ed25519"  # RFC 9864 fully-specified name for the wake tokens


def new_private_pem() -> str:
    key = Ed25519PrivateKey.generate()
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def kid_of(private_pem: str) -> str:
    """``ds_`` + the RFC 7638 thumbprint of the public key: stable for the key's lifetime."""
    return "ds_" + OKPKey.import_key(private_pem).thumbprint()


class TokenError(Exception):
    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code  # TOKEN_INVALID or TOKEN_EXPIRED


@dataclass(frozen=True)
class TokenClaims:
    subscription: str
    generation: int
    wake_id: str


class Signer:
    """Signs with the oldest key (every process picks the same one); verifies with any."""

    def __init__(self, pems: list[tuple[str, str]]) -> None:
        if not pems:
            raise ValueError("no signing key")
        self._keys: list[tuple[str, OKPKey, Ed25519PrivateKey]] = []
        for kid, pem in pems:
            private = serialization.load_pem_private_key(pem.encode(), password=None)
            if not isinstance(private, Ed25519PrivateKey):
                raise ValueError(f"signing key {kid} is not Ed25519")
            self._keys.append((kid, OKPKey.import_key(pem, {"kid": kid}), private))
        self.kid = self._keys[0][0]
        self._key_set = KeySet([k for _, k, _ in self._keys])

    def jwks(self) -> dict[str, Any]:
        keys = []
        for kid, key, _ in self._keys:
            public = key.as_dict(private=False)
            keys.append({**public, "kid": kid, "use": "sig", "alg": ALG})
        return {"keys": keys}

    def signature_header(self, body: bytes, now_s: int | None = None) -> str:
        """``t=<unix seconds>,kid=<kid>,ed25519=<base64url signature of "<t>.<body>">``."""
        t = int(time.time()) if now_s is None else now_s
        signature = self._keys[0][2].sign(f"{t}.".encode() + body)
        encoded = base64.urlsafe_b64encode(signature).rstrip(b"=").decode()
        return f"t={t},kid={self.kid},ed25519={encoded}"

    def token(self, subscription: str, generation: int, wake_id: str) -> str:
        now = int(time.time())
        claims = {
            "sub": subscription,
            "gen": generation,
            "wid": wake_id,
            "iat": now,
            "exp": now + TOKEN_LIFETIME_S,
        }
        return jwt.encode(
            {"alg": TOKEN_ALG, "kid": self.kid}, claims, self._keys[0][1], algorithms=[TOKEN_ALG]
        )

    def verify(self, token: str, subscription: str) -> TokenClaims:
        try:
            decoded = jwt.decode(token, self._key_set, algorithms=[TOKEN_ALG])
        except Exception:  # whatever a forged token makes the library raise
            # Not only JoseError and ValueError: a header whose "crit" is not a list raised
            # TypeError, a 500 on an open route that also failed the writer batch it shared.
            raise TokenError("TOKEN_INVALID") from None
        claims = decoded.claims
        exp = claims.get("exp")
        if not isinstance(exp, int) or exp < time.time():
            raise TokenError("TOKEN_EXPIRED")
        gen, wid = claims.get("gen"), claims.get("wid")
        if (
            claims.get("sub") != subscription
            or not isinstance(gen, int)
            or not isinstance(wid, str)
        ):
            raise TokenError("TOKEN_INVALID")
        return TokenClaims(subscription, gen, wid)
