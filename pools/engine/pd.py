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

from pools import costmodel
from pools.catalog import ModelSpec
from pools.wire.openai import ApiError
from topology import GpuRef, Topology, path

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
                target: Placement | None, fallback: costmodel.LinkCost) -> tuple[float, str]:
    """KV transfer time over the path between the two replicas' GPUs; each GPU of the smaller
    group moves its shard in parallel over its own path (rails), the slowest pair decides."""
    if topology is None or source is None or target is None:
        ms = costmodel.kv_bytes(model, tokens) / (fallback.bandwidth_gb_s * 1e9) * 1e3 + fallback.latency_us / 1e3
        return ms, "unknown path: the engine's own TP link assumed"
    pairs = list(zip(source.refs(), target.refs(), strict=False))
    worst = max((path(topology, a, b) for a, b in pairs), key=lambda p: costmodel.kv_transfer_ms(model, tokens, p))
    shard_tokens = max(1, tokens // len(pairs))
    return costmodel.kv_transfer_ms(model, shard_tokens, worst), f"{worst.tier} via {worst.via}"
