"""The hand-written stub engines' side of HTTP/1.1: one request read off a connection."""

from __future__ import annotations

import asyncio


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One request's head (through its blank line) and body (its content-length's bytes; none
    without that header: the router's /metrics GET)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length")), 0)
    return head, await reader.readexactly(length)
