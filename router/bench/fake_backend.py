"""A fast fake vLLM backend for the router benchmark: canned OpenAI responses, no batching.
`python -m router.bench.fake_backend --port 8001 [--itl-ms 0]` prints one ready line."""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from wire.http import serve
from wire.reader import Request
from wire.responder import Responder

BODY = json.dumps({"id": "cmpl-fake", "object": "chat.completion", "created": 0, "model": "fake",
                   "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok " * 16},
                                "finish_reason": "length"}],
                   "usage": {"prompt_tokens": 8, "completion_tokens": 16, "total_tokens": 24}}).encode()
STAMPED = (b'data: {"id":"cmpl-fake","object":"chat.completion.chunk","created":0,"model":"fake",'
           b'"choices":[{"index":0,"delta":{"content":"%d"},"finish_reason":null}]}\n\n')
CHUNK = (b'data: {"id":"cmpl-fake","object":"chat.completion.chunk","created":0,"model":"fake",'
         b'"choices":[{"index":0,"delta":{"content":" ok"},"finish_reason":null}]}\n\n')


def handler(itl_s: float) -> object:
    async def handle(request: Request, response: Responder) -> None:
        if request.path == "/metrics":
            response.send(200, b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n", "text/plain")
            return
        if request.method == "GET":
            response.send(200, b'{"object": "list", "data": [{"id": "fake", "object": "model"}]}')
            return
        body = json.loads(request.body or b"{}")
        if not body.get("stream"):
            response.send(200, BODY)
            return
        response.start_stream()
        stamped = float(body.get("itl_ms") or 0) / 1000
        gap = stamped or itl_s
        for _ in range(int(body.get("max_tokens", 16))):
            if gap:  # every stream wakes on the same grid: synchronised streams
                now = time.monotonic()
                await asyncio.sleep(gap - now % gap)
            if stamped:  # the chunk carries its send time (µs, CLOCK_MONOTONIC): delivery is measurable
                await response.write(STAMPED % (time.monotonic_ns() // 1000))
            else:
                await response.write(CHUNK)
        await response.write(b"data: [DONE]\n\n")
        response.end()

    return handle


async def main(port: int, itl_ms: float) -> None:
    server = await serve(handler(itl_ms / 1000), "127.0.0.1", port)  # type: ignore[arg-type]
    print(f"fake backend ready: http://127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--itl-ms", type=float, default=0.0)
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main(args.port, args.itl_ms))
