"""Filters, and the one health rule every part of the router applies (`healthy`, `admits`,
`usable`): the mixed profile's filters, the PD pair's candidates and admission's view of the
cluster all call these, so "which replica may take this request" is written once."""

from __future__ import annotations

from collections.abc import Sequence

from pools.model import ROLES, Role
from router.plugins.model import Candidate, Filter, RouteRequest
from router.plugins.params import Params


def healthy(c: Candidate) -> bool:
    """The routing table says it is healthy and this router's circuit breaker for it is closed."""
    return c.endpoint.healthy and not c.load.breaker_open


def admits(c: Candidate, sheddable: bool) -> bool:
    """A draining replica takes no new traffic of the classes that are not sheddable."""
    return sheddable or not c.endpoint.draining


def usable(c: Candidate, sheddable: bool) -> bool:
    return healthy(c) and admits(c, sheddable)


def usable_of(req: RouteRequest, snapshot: Sequence[Candidate], role: Role) -> list[Candidate]:
    """The replicas of the request's model in `role` that may take it: `usable`, spelled out
    (this runs for every replica on every request; test_routing_plugins checks they agree)."""
    model, sheddable = req.model, req.slo_class.sheddable
    return [c for c in snapshot
            if (e := c.endpoint).model == model and e.role == role and e.healthy and not c.load.breaker_open
            and (sheddable or not e.draining)]


class HealthFilter(Filter):
    def keep(self, req: RouteRequest, c: Candidate) -> bool:
        return healthy(c)


class DrainFilter(Filter):
    def keep(self, req: RouteRequest, c: Candidate) -> bool:
        return admits(c, req.slo_class.sheddable)


class RoleFilter(Filter):
    """Replicas of the role the request asks for (mixed when it asks for none), or of the
    configured `role`."""

    def __init__(self, role: str | None) -> None:
        self.role = role

    def keep(self, req: RouteRequest, c: Candidate) -> bool:
        return c.endpoint.role == (self.role or req.role or "mixed")


def health(p: Params) -> Filter:
    p.done()
    return HealthFilter()


def drain(p: Params) -> Filter:
    p.done()
    return DrainFilter()


def role(p: Params) -> Filter:
    chosen = p.choice("role", None, ROLES)
    p.done()
    return RoleFilter(chosen)
