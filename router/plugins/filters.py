"""Filters, and the one health rule every part of the router applies (`healthy`, `admits`,
`usable`): the mixed profile's filters, the PD pair's candidates and admission's view of the
cluster all call these, so "which replica may take this request" is written once.

Two rules keep classes apart (issue 28, fair shares):
- `serves_class`: a replica whose pool declares `slo_classes` takes only those classes; a pool
  that declares none takes every class. A class that no replica of the model is declared for
  (and no open pool serves) may use every pool (`RouteRequest.any_pool`): a config that leaves a
  class out degrades to routing by load instead of refusing it.
- `has_headroom`: a class with a `seq_share` under 1 is sent to a replica only while the
  sequences there (the engine's running + waiting as last scraped, or this router's own open
  sequences if more), with the request's, stay within that share of the engine's max_num_seqs:
  the rest of the slots stay free for higher classes, so a batch key cannot fill an engine that
  interactive traffic needs.

And one rule of what a replica can serve: `fits_context`, a replica whose context (its engine's
max_model_len) cannot hold the request's prompt and max_tokens is not sent it (vLLM would refuse
it, or cut its output short), when another replica of the model can (issue 30: an RTX 4090's
27,008 tokens beside an H100's 131,072).
"""

from __future__ import annotations

from collections.abc import Sequence

from pools.model import ROLES, Role
from router.plugins.model import Candidate, Filter, RouteRequest
from router.plugins.params import Params

DEFAULT_MAX_NUM_SEQS = 256
"""An engine's sequence limit when the routing table does not say (vLLM's default max_num_seqs)."""


def healthy(c: Candidate) -> bool:
    """The routing table says it is healthy and this router's circuit breaker for it is closed."""
    return c.endpoint.healthy and not c.load.breaker_open


def admits(c: Candidate, sheddable: bool) -> bool:
    """A draining replica takes no new traffic of the classes that are not sheddable."""
    return sheddable or not c.endpoint.draining


def usable(c: Candidate, sheddable: bool) -> bool:
    return healthy(c) and admits(c, sheddable)


def serves_class(req: RouteRequest, c: Candidate) -> bool:
    """The replica's pool is declared for the request's class, declares none, or no pool of the
    model is declared for it (module docstring)."""
    classes = c.endpoint.slo_classes
    return not classes or req.any_pool or req.slo_class.name in classes


def class_servable(req: RouteRequest, snapshot: Sequence[Candidate]) -> bool:
    """A mixed or decode replica of the request's model, of a pool that serves its class, can take
    it now (healthy, breaker closed, not draining unless the class is sheddable): without one,
    the class's own pools cannot serve it at all (a prefill alone cannot)."""
    model, sheddable = req.model, req.slo_class.sheddable
    return any(c.endpoint.model == model and c.endpoint.role != "prefill" and usable(c, sheddable)
               and serves_class(req, c) for c in snapshot)


def occupied(c: Candidate) -> float:
    """Sequences on the replica: the engine's running + waiting as last scraped, or this router's
    own open sequences when it knows of more (a scrape is up to an interval old)."""
    load = c.load
    return max(load.running + load.waiting, float(load.seqs))


def seq_limit(c: Candidate) -> int:
    return c.endpoint.max_num_seqs or DEFAULT_MAX_NUM_SEQS


def has_headroom(req: RouteRequest, c: Candidate) -> bool:
    """The request's sequences fit within its class's share of the replica's sequence slots."""
    share = req.seq_share
    return share >= 1.0 or occupied(c) + req.seqs <= share * seq_limit(c)


def fits_context(req: RouteRequest, c: Candidate) -> bool:
    """The replica's context holds what the request needs there: a prefill leg its prompt and
    the one token it writes, any other its longest prompt and max_tokens
    (`RouteRequest.context_tokens`). A replica whose context is not known yet may take it."""
    limit = c.load.context
    if limit <= 0:
        return True
    need = req.prompt_tokens + 1 if c.endpoint.role == "prefill" else req.context_tokens
    return need <= limit


def usable_of(req: RouteRequest, snapshot: Sequence[Candidate], role: Role) -> list[Candidate]:
    """The replicas of the request's model in `role` that may take it: the default filters
    (health, drain, role, SLO class, headroom, context) spelled out (this runs for every replica on every
    request; test_routing_plugins checks they agree)."""
    model, sheddable = req.model, req.slo_class.sheddable
    return [c for c in snapshot
            if (e := c.endpoint).model == model and e.role == role and e.healthy and not c.load.breaker_open
            and (sheddable or not e.draining) and serves_class(req, c) and has_headroom(req, c)
            and fits_context(req, c)]


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


class SLOClassFilter(Filter):
    """Replicas whose pool serves the request's class (`serves_class`)."""

    def keep(self, req: RouteRequest, c: Candidate) -> bool:
        return serves_class(req, c)


class HeadroomFilter(Filter):
    """Replicas with sequence slots left within the request's class share (`has_headroom`)."""

    def keep(self, req: RouteRequest, c: Candidate) -> bool:
        return has_headroom(req, c)


class ContextFilter(Filter):
    """Replicas whose context holds the request (`fits_context`)."""

    def keep(self, req: RouteRequest, c: Candidate) -> bool:
        return fits_context(req, c)


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


def slo_class(p: Params) -> Filter:
    p.done()
    return SLOClassFilter()


def headroom(p: Params) -> Filter:
    p.done()
    return HeadroomFilter()


def context(p: Params) -> Filter:
    p.done()
    return ContextFilter()
