"""API keys as the router holds them: never the key, never a bare hash of it.

A key reaches the router's configuration in one of four forms (`router.config.KeyConfig`):
`key_hmac_sha256` (`SALT:HMAC-SHA256(SALT, key)`, hex; `python -m router hash-key` writes it with
a fresh salt; one salt for a whole deployment is the intended use), `key_env` or `key_file` (the
key itself, read at start), or `key_sha256` (an unsalted SHA-256, accepted as before but
precomputable: prefer the others). In memory each becomes a *seal*: an HMAC-SHA256 under a
secret drawn when the router starts and kept nowhere else, so the tables hold nothing an
attacker could compare against or precompute, and a lookup's timing depends only on values the
attacker cannot compute (the comparison is `hmac.compare_digest` on seals).

A presented key is turned into the seal of each form in use (one HMAC per distinct salt, plus
one SHA-256 when unsalted hashes are configured) and looked up.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

SALT_BYTES = 16


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def hmac_hex(salt: bytes, key: str) -> str:
    return hmac.new(salt, key.encode(), hashlib.sha256).hexdigest()


def salted(key: str, salt: bytes | None = None) -> str:
    """`SALT:HMAC-SHA256(SALT, key)` in hex, the `key_hmac_sha256` form (a fresh salt unless given)."""
    salt = salt if salt is not None else secrets.token_bytes(SALT_BYTES)
    return f"{salt.hex()}:{hmac_hex(salt, key)}"


@dataclass(frozen=True, slots=True)
class Stored:
    """One configured key: `salt` None for an unsalted SHA-256 `digest`, else the HMAC's salt."""

    digest: str
    salt: bytes | None = None


class Keyring:
    """Configured keys -> values (a tenant's principal), by seal."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret if secret is not None else secrets.token_bytes(32)
        self._values: dict[bytes, object] = {}
        self._salts: list[bytes] = []
        self._unsalted = False

    def _seal(self, kind: bytes, digest: str) -> bytes:
        return hmac.new(self._secret, kind + bytes.fromhex(digest), hashlib.sha256).digest()

    def add(self, stored: Stored, value: object) -> None:
        if stored.salt is None:
            self._unsalted = True
            self._values[self._seal(b"s", stored.digest)] = value
            return
        if stored.salt not in self._salts:
            self._salts.append(stored.salt)
        self._values[self._seal(b"h" + stored.salt, stored.digest)] = value

    def seals(self, key: str) -> list[bytes]:
        """The seals a presented key would have in each form in use."""
        out = [self._seal(b"h" + salt, hmac_hex(salt, key)) for salt in self._salts]
        if self._unsalted:
            out.append(self._seal(b"s", sha256_hex(key)))
        return out

    def find(self, key: str) -> object | None:
        for seal in self.seals(key):
            value = self._values.get(seal)
            if value is not None:
                return value
        return None

    def holds(self, key: str) -> bool:
        """Whether `key` is configured, comparing seals with `hmac.compare_digest` one by one."""
        wanted = self.seals(key)
        found = False
        for known in self._values:
            for seal in wanted:
                found |= hmac.compare_digest(known, seal)
        return found
