"""API keys as the router holds them (router.keys, router.auth): salted forms in configs, seals in
memory, nothing derived from a key that an attacker could compare against, and admin keys
compared in constant time."""

from __future__ import annotations

import hashlib
import hmac
import subprocess
import sys
from typing import Any

import pytest

from router.auth import Auth, Principal
from router.config import parse_router_config
from router.keys import Keyring, Stored, salted, sha256_hex
from tests.conftest import ROOT
from topology.errors import ParseError
from wire.errors import ApiError

pytestmark = pytest.mark.unit

SALT = bytes(range(16))
USER, ADMIN, OLD = "user-key-0123456789", "admin-key-abcdef", "legacy-key-xyz"


def _auth(**extra: Any) -> Auth:
    return Auth(parse_router_config({
        "port": 0,
        "keys": [{"tenant": "salted", "key_hmac_sha256": salted(USER, SALT)},
                 {"tenant": "legacy", "key_sha256": sha256_hex(OLD), "slo_classes": ["batch"]}],
        "admin_keys": [{"tenant": "ops", "key_hmac_sha256": salted(ADMIN, SALT)}], **extra}))


def _bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def test_salted_and_legacy_keys_both_authenticate_and_wrong_ones_do_not() -> None:
    auth = _auth()
    assert auth.user(_bearer(USER)).tenant == "salted"
    legacy = auth.user(_bearer(OLD))
    assert isinstance(legacy, Principal) and legacy.tenant == "legacy" and legacy.classes == frozenset({"batch"})
    for wrong in (USER + "x", ADMIN, sha256_hex(USER), salted(USER, SALT)):
        with pytest.raises(ApiError) as err:
            auth.user(_bearer(wrong))
        assert err.value.status == 401
    auth.admin(_bearer(ADMIN))
    with pytest.raises(ApiError) as err:
        auth.admin(_bearer(USER))
    assert err.value.status == 403


def test_memory_holds_only_seals_never_a_key_or_its_hashes() -> None:
    """What an attacker could match (the key, its SHA-256, the config's HMAC) is nowhere in the
    keyrings; two routers seal the same key differently (a secret per process)."""
    auth = _auth()
    derived = set()
    for key in (USER, ADMIN, OLD):
        derived |= {key.encode(), hashlib.sha256(key.encode()).digest(), bytes.fromhex(sha256_hex(key)),
                    hmac.new(SALT, key.encode(), hashlib.sha256).digest()}
    held = [*auth.users._values, *auth.admins._values]
    assert held and not derived & set(held)
    assert not any(d in seal for d in derived for seal in held)
    assert set(_auth().users._values).isdisjoint(auth.users._values)


def test_admin_keys_are_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every configured admin seal is compared with hmac.compare_digest, whether the key matches
    the first, the last or none: the work does not depend on where (or whether) it matches."""
    ring = Keyring()
    keys = [f"admin-{i}" for i in range(5)]
    for key in keys:
        ring.add(Stored(sha256_hex(key)), key)
    calls: list[int] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append(1)
        return real(a, b)

    monkeypatch.setattr("router.keys.hmac.compare_digest", counting)
    counts = []
    for presented in (keys[0], keys[-1], "nobody"):
        calls.clear()
        assert ring.holds(presented) is (presented != "nobody")
        counts.append(len(calls))
    assert counts == [5, 5, 5]


def test_hash_key_reads_stdin_and_writes_the_config_form() -> None:
    done = subprocess.run([sys.executable, "-m", "router", "hash-key", "--salt", SALT.hex()], input=f"{USER}\n",
                          capture_output=True, text=True, cwd=ROOT, timeout=60, check=True)
    line = done.stdout.strip()
    assert line == salted(USER, SALT)
    auth = Auth(parse_router_config({"port": 0, "keys": [{"tenant": "t", "key_hmac_sha256": line}],
                                     "admin_keys": [{"tenant": "ops", "key_sha256": sha256_hex(ADMIN)}]}))
    assert auth.user(_bearer(USER)).tenant == "t"
    bad = subprocess.run([sys.executable, "-m", "router", "hash-key", "--salt", "abcd"], input=f"{USER}\n",
                         capture_output=True, text=True, cwd=ROOT, timeout=60, check=False)
    assert bad.returncode == 2 and "at least 16 bytes" in bad.stderr


def test_a_key_may_come_in_exactly_one_form() -> None:
    with pytest.raises(ParseError, match="exactly one of key_hmac_sha256"):
        parse_router_config({"port": 0, "keys": [{"tenant": "t", "key_hmac_sha256": salted(USER, SALT),
                                                  "key_sha256": sha256_hex(USER)}]})
