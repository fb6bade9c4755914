"""Per-tenant and per-class quotas (issue 28, fair shares): requests in flight per tenant, and a
token rate per tenant and per class, each a token bucket charged with the request's cost bound
(`router.cost.RequestCost.tokens`: prompt plus max_tokens per sequence) when it is admitted.

A request over a quota gets 429 with Retry-After (when the bucket will hold its tokens again, or
1 s for a concurrency limit); quotas are counted per router worker, each holding its share of a
limit (as admission does). A request costing more than a bucket's burst passes when the bucket
is full and leaves it in debt, so a large request is paced, never refused for good.

The class concurrency limit is the SLO class's own `max_concurrency` (`router.admission`).
The clock is injected: tests step it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from wire.errors import ApiError

BURST_S = 10.0
"""A bucket holds this many seconds of its rate when no burst is configured."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Quota:
    max_concurrency: int | None = None
    tokens_per_s: float | None = None
    burst_tokens: float | None = None
    """None: `tokens_per_s` x BURST_S."""

    def shared(self, share: int) -> Quota:
        """This quota's part for one of `share` router workers."""
        if share <= 1:
            return self
        most = self.max_concurrency
        return Quota(max_concurrency=None if most is None else max(1, -(-most // share)),
                     tokens_per_s=None if self.tokens_per_s is None else self.tokens_per_s / share,
                     burst_tokens=None if self.burst_tokens is None else self.burst_tokens / share)


class Bucket:
    __slots__ = ("at", "burst", "level", "rate")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate, self.burst, self.level, self.at = rate, burst, burst, now

    def _refill(self, now: float) -> None:
        self.level = min(self.burst, self.level + (now - self.at) * self.rate)
        self.at = now

    def wait_s(self, tokens: float, now: float) -> float:
        """0 and the tokens taken, or how long until they could be (nothing taken)."""
        self._refill(now)
        need = min(tokens, self.burst)
        if self.level >= need:
            self.level -= tokens
            return 0.0
        return (need - self.level) / self.rate

    def reserve(self, tokens: float, now: float, max_wait_s: float) -> float | None:
        """Queue for the tokens: how long to wait before going on (taken now, so later callers
        wait behind), or None when that would be longer than `max_wait_s` (nothing taken). A
        request larger than the burst takes a whole bucket."""
        self._refill(now)
        need = min(tokens, self.burst)
        delay = max(0.0, (need - self.level) / self.rate)
        if delay > max_wait_s:
            return None
        self.level -= need
        return delay

    def refund(self, tokens: float) -> None:
        self.level = min(self.burst, self.level + tokens)


def _bucket(q: Quota, now: float) -> Bucket | None:
    if q.tokens_per_s is None:
        return None
    return Bucket(q.tokens_per_s, q.burst_tokens if q.burst_tokens is not None else q.tokens_per_s * BURST_S, now)


def _too_many(what: str, wait_s: float, cause: str) -> ApiError:
    retry = max(1, math.ceil(wait_s))
    return ApiError(429, f"{what}; retry after {retry} s", "rate_limit_error", cause=cause,
                    headers=(("retry-after", str(retry)),))


class Quotas:
    def __init__(self, tenants: Mapping[str, Quota], default: Quota, classes: Mapping[str, Quota],
                 clock: Callable[[], float], share: int = 1) -> None:
        """`tenants`: each configured tenant's quota (others get `default`); `classes`: token
        rates by class name; `share`: the router's worker processes."""
        self.share = share
        self.tenants = {name: q.shared(share) for name, q in tenants.items()}
        self.default = default.shared(share)
        self.clock = clock
        now = clock()
        self.class_buckets = {name: b for name, q in classes.items() if (b := _bucket(q.shared(share), now))}
        self.tenant_buckets: dict[str, Bucket | None] = {}
        self.inflight: dict[str, int] = {}

    def quota(self, tenant: str) -> Quota:
        return self.tenants.get(tenant, self.default)

    def enter(self, tenant: str, slo_name: str, tokens: int) -> None:
        """Count the request in, or raise 429 (nothing counted)."""
        q = self.quota(tenant)
        running = self.inflight.get(tenant, 0)
        if q.max_concurrency is not None and running >= q.max_concurrency:
            raise _too_many(f"this key has {running} requests in flight, its limit", 1.0, "key_concurrency")
        now = self.clock()
        if tenant not in self.tenant_buckets:
            self.tenant_buckets[tenant] = _bucket(q, now)
        mine = self.tenant_buckets[tenant]
        if mine is not None:
            wait = mine.wait_s(tokens, now)
            if wait > 0:
                raise _too_many(f"this key is over its token rate ({mine.rate * self.share:g} tokens/s)", wait,
                                "key_token_rate")
        shared = self.class_buckets.get(slo_name)
        if shared is not None:
            wait = shared.wait_s(tokens, now)
            if wait > 0:
                if mine is not None:
                    mine.refund(tokens)
                raise _too_many(f"class {slo_name} is over its token rate ({shared.rate * self.share:g} tokens/s)",
                                wait, "class_token_rate")
        self.inflight[tenant] = running + 1

    def leave(self, tenant: str) -> None:
        running = self.inflight.get(tenant, 0)
        if running > 1:
            self.inflight[tenant] = running - 1
        else:
            self.inflight.pop(tenant, None)
