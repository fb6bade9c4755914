"""API keys to tenants and SLO classes. Every key, admin included, comes as
`Authorization: Bearer <key>`; `x-slo-class` may only narrow to a class the key is entitled to.
Keys are held as seals (`router.keys`): an HMAC under a secret of this process, never the key or
a bare hash of it."""

from __future__ import annotations

from dataclasses import dataclass

from pools.model import SLOClass
from router.config import RouterConfig
from router.keys import Keyring
from wire.errors import ApiError

SEEN_KEYS = 1024


@dataclass(frozen=True, slots=True)
class Principal:
    tenant: str
    classes: frozenset[str]


class Auth:
    def __init__(self, config: RouterConfig) -> None:
        all_classes = frozenset(config.classes())
        self.users = Keyring()
        for key in config.keys:
            classes = all_classes if "*" in key.slo_classes else frozenset(key.slo_classes)
            self.users.add(key.stored(), Principal(key.tenant, classes))
        self.admins = Keyring()
        for key in config.admin_keys:
            self.admins.add(key.stored(), key.tenant)
        self.open = not config.keys and not config.require_keys
        self.classes = config.classes()
        self.default = config.default_slo_class
        self.anonymous = Principal("anonymous", frozenset(self.classes))
        self._defaults: dict[frozenset[str], SLOClass] = {}
        self._seen: dict[str, Principal] = {}
        """Valid Authorization values already checked (only valid ones, so it stays small):
        hashing every request's key is the costliest part of authenticating it."""

    @staticmethod
    def _token(headers: dict[str, str]) -> str | None:
        value = headers.get("authorization", "")
        scheme, _, token = value.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        return token.strip()

    def user(self, headers: dict[str, str]) -> Principal:
        if self.open:
            return self.anonymous
        seen = self._seen.get(headers.get("authorization", ""))
        if seen is not None:
            return seen
        token = self._token(headers)
        if token is None:
            raise ApiError(401, "missing API key: send `Authorization: Bearer <key>`", "authentication_error")
        principal = self.users.find(token)  # by seal: its timing tells nothing an attacker can use
        if not isinstance(principal, Principal):
            raise ApiError(401, "invalid API key", "authentication_error")
        if len(self._seen) < SEEN_KEYS:
            self._seen[headers["authorization"]] = principal
        return principal

    def admin(self, headers: dict[str, str]) -> None:
        token = self._token(headers)
        if token is None:
            raise ApiError(401, "missing admin key: send `Authorization: Bearer <admin key>`", "authentication_error")
        if not self.admins.holds(token):  # every seal compared, each in constant time
            raise ApiError(403, "this key does not open admin routes", "permission_error")

    def slo_class(self, principal: Principal, requested: str | None) -> SLOClass:
        """The class the request runs in: the header's, if the key is entitled to it; else the
        key's strictest (lowest priority value) entitled class, or the configured default. A header
        that is there but empty is refused (400), as one naming no class."""
        if requested is not None:
            if not requested.strip():
                raise ApiError(400, f"x-slo-class is empty: name one of {sorted(self.classes)} or leave the header "
                                    "out", param="x-slo-class", cause="invalid_slo_class")
            if requested not in self.classes:
                raise ApiError(400, f"unknown SLO class {requested!r}", param="x-slo-class")
            if requested not in principal.classes:
                raise ApiError(403, f"this key is not entitled to SLO class {requested!r}", "permission_error")
            return self.classes[requested]
        found = self._defaults.get(principal.classes)
        if found is None:
            found = self._defaults[principal.classes] = self._default_for(principal)
        return found

    def _default_for(self, principal: Principal) -> SLOClass:
        if self.default is not None and self.default in principal.classes:
            return self.classes[self.default]
        entitled = [self.classes[c] for c in principal.classes if c in self.classes]
        return min(entitled, key=lambda c: c.priority)
