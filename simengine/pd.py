"""Prefill/decode disaggregation, vLLM's proxy protocol as the simulated engine speaks it.

The prefill engine receives `kv_transfer_params: {"do_remote_decode": true}` (and
`max_tokens: 1`), runs the prefill, keeps the blocks, and returns `kv_transfer_params` the way
vLLM's NixlConnector does (`do_remote_prefill`, `remote_engine_id`, `remote_block_ids`,
`remote_host`, `remote_port`, `remote_request_id`, `tp_size`) plus `isle_placement` (its node and
GPUs) so the decode side can price the transfer over the real path. The decode engine claims
the blocks from the prefill engine (a stale or unknown claim is a clear 400, never a hang),
then waits the transfer time from the cost model before its first token.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from physics import kvtransfer
from physics.catalog import ModelSpec
from topology import GpuRef, Path, Topology, path
from wire.errors import ApiError

REQUIRED = ("remote_engine_id", "remote_host", "remote_port", "remote_request_id")


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    node: str
    gpus: tuple[int, ...]

    def refs(self) -> list[GpuRef]:
        return [GpuRef(self.node, g) for g in self.gpus]

    def as_json(self) -> dict[str, Any]:
        return {"node": self.node, "gpus": list(self.gpus)}


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def wants_remote_decode(params: dict[str, Any] | None) -> bool:
    return bool(params and params.get("do_remote_decode"))


def wants_remote_prefill(params: dict[str, Any] | None) -> bool:
    return bool(params and params.get("do_remote_prefill"))


def check_decode_params(params: dict[str, Any]) -> None:
    missing = [k for k in REQUIRED if params.get(k) in (None, "")]
    if missing:
        raise ApiError(400, f"kv_transfer_params is missing {', '.join(missing)}", param="kv_transfer_params")
    if not isinstance(params["remote_port"], int) or not is_loopback(str(params["remote_host"])):
        raise ApiError(400, "kv_transfer_params must name a loopback prefill engine (remote_host, remote_port)",
                       param="kv_transfer_params")


def prefill_params(engine_id: str, rid: str, host: str, port: int, tp: int, blocks: int, prompt_tokens: int,
                   placement: Placement | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": engine_id,
        "remote_block_ids": list(range(blocks)), "remote_host": host, "remote_port": port,
        "remote_request_id": rid, "tp_size": tp, "prompt_tokens": prompt_tokens,
    }
    if placement is not None:
        out["isle_placement"] = placement.as_json()
    return out


def transfer_ms(model: ModelSpec, tokens: int, topology: Topology | None, source: Placement | None,
                target: Placement | None) -> tuple[float, str]:
    """KV transfer time over the paths between the two replicas' GPUs, as the router prices it
    (`kvtransfer.kv_handover_ms`: each rank pair moves its shard at once, pairs on one carrier
    share it); without both placements in a topology, the same-node fallback path."""
    paths = kv_paths(topology, source, target)
    worst = min(paths, key=kvtransfer.kv_rate_gb_s)
    return kvtransfer.kv_handover_ms(model, tokens, paths), f"{worst.tier} via {worst.via}"


def kv_paths(topology: Topology | None, source: Placement | None, target: Placement | None) -> list[Path]:
    """One path per rank pair between the two replicas' GPUs; without both placements in a
    topology, the same-node fallback path (its `via` says it is assumed)."""
    if topology is None or source is None or target is None:
        return [kvtransfer.KV_SAME_NODE_FALLBACK]
    return [path(topology, a, b) for a, b in zip(source.refs(), target.refs(), strict=False)]
