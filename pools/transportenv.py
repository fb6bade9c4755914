"""Does the engine's environment carry the transport the plan implies? (issue 34; pure: the
planned variables, the fabric and the engine process's real environment in, mismatches out).

The plan's pin (`pools.pinning.pin_for`) sets the nearest NICs: on an RDMA fabric `NCCL_IB_HCA`
and `UCX_NET_DEVICES` (`<device>:1`), else `NCCL_SOCKET_IFNAME` and `UCX_NET_DEVICES`. Whatever
else reaches the engine (a pool's vLLM `extra_env`, the Ray runtime environment, the node's own
environment the launcher inherits) may undo it without a word: NIXL's default backend is UCX
and reads UCX's variables; NCCL (the TP group's collectives) reads its own. What each check
means, as the libraries document it:

    UCX_NET_DEVICES     UCX's devices (`mlx5_0:1`; `all` by default). Not the plan's: the KV
                        transfer leaves by another NIC (or, with an Ethernet device on an RDMA
                        plan, over TCP).
    UCX_TLS             UCX's transports: a list (`rc,cuda_copy`) or, with a leading `^`, the
                        ones excluded. RDMA transports are rc, ud, dc and their _v/_x/_verbs/
                        _mlx5 forms, `ib` and `all`. On an RDMA plan a list without any of them
                        (`tcp,cuda_copy`), or an exclusion of `ib` or of rc, ud and dc all, puts
                        the transfer on TCP.
    NCCL_IB_HCA         NCCL's RDMA devices (a list of prefixes, `=` for exact names, `^` to
                        exclude, `:port` optional). Compared as device names with the plan's.
    NCCL_IB_DISABLE     1: NCCL does not use IB/RoCE and falls back to IP sockets.
    NCCL_NET            forces NCCL's network module; `Socket` is TCP/IP on an RDMA plan.
    NCCL_SOCKET_IFNAME  the IP interfaces NCCL uses: compared with the plan's where the plan
                        sets it (a TCP fabric). On an RDMA plan NCCL still opens sockets for
                        its bootstrap, so setting it there is no mismatch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

TRANSPORT_ENV = ("UCX_NET_DEVICES", "UCX_TLS", "NCCL_IB_HCA", "NCCL_IB_DISABLE", "NCCL_NET", "NCCL_SOCKET_IFNAME")
"""The variables the check reads from the engine's environment."""
_RDMA_TLS = ("rc", "ud", "dc")


@dataclass(frozen=True, slots=True, kw_only=True)
class Mismatch:
    variable: str
    planned: str | None
    """What the plan set (None: the plan leaves it alone, and the value itself is the problem)."""
    actual: str | None
    """What the engine has (None: unset)."""
    why: str

    def to_json(self) -> dict[str, str | None]:
        return {"variable": self.variable, "planned": self.planned, "actual": self.actual, "why": self.why}


def transport_mismatches(planned: Mapping[str, str], rdma: bool, actual: Mapping[str, str]) -> tuple[Mismatch, ...]:
    """What in `actual` (the engine process's environment) contradicts the plan (`planned`, the
    pin's variables; `rdma`: the plan sends the replica's network traffic over RDMA, i.e. it set
    `NCCL_IB_HCA`), in the order of TRANSPORT_ENV."""
    rdma = rdma and "NCCL_IB_HCA" in planned
    found: list[Mismatch] = []
    for name in ("UCX_NET_DEVICES", "NCCL_IB_HCA", "NCCL_SOCKET_IFNAME"):
        want, have = planned.get(name), actual.get(name)
        if want is not None and _devices(want) != _devices(have):
            found.append(Mismatch(variable=name, planned=want, actual=have,
                                  why="unset: the library picks devices itself" if have is None else
                                  "other devices than the plan's nearest NICs"))
    if not rdma:
        return tuple(_ordered(found))
    tls = actual.get("UCX_TLS")
    if tls is not None and not _rdma_allowed(tls):
        found.append(Mismatch(variable="UCX_TLS", planned=None, actual=tls,
                              why="no RDMA transport (rc, ud, dc, ib) on an RDMA plan: UCX, and NIXL over it, "
                                  "move the KV cache over TCP"))
    if actual.get("NCCL_IB_DISABLE", "").strip() == "1":
        found.append(Mismatch(variable="NCCL_IB_DISABLE", planned=None, actual="1",
                              why="NCCL does not use IB/RoCE and falls back to IP sockets on an RDMA plan"))
    net = actual.get("NCCL_NET")
    if net is not None and net.strip().lower() == "socket":
        found.append(Mismatch(variable="NCCL_NET", planned=None, actual=net,
                              why="NCCL forced onto its socket (TCP/IP) network on an RDMA plan"))
    return tuple(_ordered(found))


def _ordered(found: list[Mismatch]) -> list[Mismatch]:
    return sorted(found, key=lambda m: TRANSPORT_ENV.index(m.variable))


def _devices(value: str | None) -> frozenset[str] | None:
    """A device list as names: `=` (exact match) and `:port` dropped; an exclusion (`^`) or
    unset stays distinct from any list."""
    if value is None:
        return None
    text = value.strip()
    if text.startswith("^"):
        return frozenset({text})
    return frozenset(item.strip().lstrip("=").split(":", 1)[0] for item in text.split(",") if item.strip())


def _rdma_tl(name: str) -> bool:
    base = name.split(":", 1)[0].strip().lower()  # `ud:aux`: an auxiliary transport, still UD
    return base in ("all", "ib") or any(base == t or base.startswith(f"{t}_") for t in _RDMA_TLS)


def _rdma_allowed(tls: str) -> bool:
    """Whether UCX_TLS leaves UCX an RDMA transport."""
    text = tls.strip()
    if not text:
        return True  # empty: UCX's default, all
    if text.startswith("^"):
        excluded = {item.split(":", 1)[0].strip().lower() for item in text[1:].split(",")}
        return "ib" not in excluded and "all" not in excluded and not set(_RDMA_TLS) <= excluded
    return any(_rdma_tl(item) for item in text.split(","))
