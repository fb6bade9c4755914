"""What runs where: pool specs, placement policies, the cost model, plans, the Ray controller,
engine launchers. Built on `topology`; the placement issue fills it in."""

from pools.native import ensure as _ensure_native

_ensure_native()  # before any compiled module of the request path is imported
