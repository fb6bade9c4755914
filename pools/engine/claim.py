"""The decode side's claim on a prefill engine's KV blocks (a loopback HTTP call with a
deadline): success, or a clear error for stale params or an unreachable prefill engine."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from pools.wire.openai import ApiError

CLAIM_TIMEOUT_S = 5.0


async def claim_blocks(params: dict[str, Any]) -> None:
    host, port = str(params["remote_host"]), int(params["remote_port"])
    body = json.dumps({"request_id": params["remote_request_id"], "engine_id": params["remote_engine_id"]}).encode()
    head = (f"POST /internal/kv/release HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode()
    writer: asyncio.StreamWriter | None = None
    try:
        reader, conn = await asyncio.wait_for(asyncio.open_connection(host, port), CLAIM_TIMEOUT_S)
        writer = conn
        conn.write(head + body)
        status_line = await asyncio.wait_for(reader.readline(), CLAIM_TIMEOUT_S)
    except (OSError, TimeoutError):
        raise ApiError(503, f"prefill engine {params['remote_engine_id']} at {host}:{port} is unreachable; "
                            "the KV cache cannot be fetched", "service_unavailable") from None
    finally:
        if writer is not None:
            writer.close()
    parts = status_line.split()
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    if status == 404:
        raise ApiError(400, f"stale kv_transfer_params: prefill engine {params['remote_engine_id']} no longer holds "
                            f"request {params['remote_request_id']} (expired or already taken)",
                       param="kv_transfer_params")
    if status != 200:
        raise ApiError(502, f"prefill engine {params['remote_engine_id']} refused the KV claim (HTTP {status})",
                       "bad_gateway")
