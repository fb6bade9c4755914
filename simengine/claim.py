"""The decode side's claim on a prefill engine's KV blocks (a loopback HTTP call with a
deadline): success, or a clear error for stale params or an unreachable prefill engine."""

from __future__ import annotations

from typing import Any

from wire.client import AsyncClient, ClientError, origin
from wire.errors import ApiError

CLAIM_TIMEOUT_S = 5.0


async def claim_blocks(params: dict[str, Any]) -> None:
    host, port = str(params["remote_host"]), int(params["remote_port"])
    body = {"request_id": params["remote_request_id"], "engine_id": params["remote_engine_id"]}
    try:
        async with AsyncClient(origin(host, port), timeout_s=CLAIM_TIMEOUT_S, max_idle=0) as client:
            status = (await client.request("POST", "/internal/kv/release", json_body=body)).status
    except ClientError:
        raise ApiError(503, f"prefill engine {params['remote_engine_id']} at {host}:{port} is unreachable; "
                            "the KV cache cannot be fetched", "service_unavailable") from None
    if status == 404:
        raise ApiError(400, f"stale kv_transfer_params: prefill engine {params['remote_engine_id']} no longer holds "
                            f"request {params['remote_request_id']} (expired or already taken)",
                       param="kv_transfer_params")
    if status != 200:
        raise ApiError(502, f"prefill engine {params['remote_engine_id']} refused the KV claim (HTTP {status})",
                       "bad_gateway")
