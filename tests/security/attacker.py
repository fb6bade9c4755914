"""One batch key attacking the router, from its own process as an adversary's client would be:
`python -m tests.security.attacker URL KEY MODEL`. It prints `ready` once its client is up, sends
every attack in ATTACKS three times over, as fast as the router lets them in (a refused one is
sent again 0.2 s later, sooner than Retry-After asks), holds each admitted one open, and stops
when its standard input closes: the held connections close (the router aborts their engine
requests) and the last line it prints is the JSON count of each HTTP status it got (0: no answer,
-1: the sender itself failed, said on standard error).

In its own process because a thread of the measuring test would share that test's interpreter:
its event loop and response parsing took the GIL from the interactive client and added up to
90 ms to TTFTs that the router had served in 20 (p99 over 300: 33-48 ms with the attacker as a
thread, 27-28 ms with it in a process, on the same two cores)."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from typing import Any

import httpx

ATTACKS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("/completions", {"n": 256, "max_tokens": 32768}),
    ("/chat/completions", {"n": 256}),  # max_tokens omitted: the engine would go on to the model's context
    ("/chat/completions", {"n": 16}),
    ("/completions", {"n": 32, "max_tokens": 32768}),  # over the token bound: n x (prompt + max_tokens)
    ("/completions", {"n": 32, "max_tokens": 30000}),
    ("/completions", {"n": 4, "prompt": ["batch work"] * 4, "max_tokens": 30000}),
)
"""(route, body fields) of each attack; every one with ignore_eos."""
COPIES = 3
"""Concurrent senders of each attack."""


async def _send(client: httpx.AsyncClient, url: str, model: str, route: str, attack: dict[str, Any],
                statuses: dict[int, int], stop: asyncio.Event) -> None:
    text = "batch work " * 20
    prompt = {"prompt": text} if route == "/completions" else {"messages": [{"role": "user", "content": text}]}
    body = {"model": model, "ignore_eos": True, **prompt, **attack}
    while not stop.is_set():
        try:
            r = await client.post(f"{url}{route}", json=body, timeout=None)
            status = r.status_code
        except httpx.HTTPError:
            status = 0
        except Exception as err:  # a sender that broke would weaken the attack unseen: counted, and it goes on
            print(f"attacker: {route}: {err!r}", file=sys.stderr, flush=True)
            status = -1
        statuses[status] = statuses.get(status, 0) + 1
        await asyncio.sleep(0.2)


async def attack(url: str, key: str, model: str) -> dict[int, int]:
    """Until standard input closes; the count of each status."""
    statuses: dict[int, int] = {}
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    threading.Thread(target=lambda: (sys.stdin.read(), loop.call_soon_threadsafe(stop.set)), daemon=True).start()
    headers = {"authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(headers=headers, limits=httpx.Limits(max_connections=64)) as client:
        tasks = [asyncio.create_task(_send(client, url, model, route, a, statuses, stop))
                 for route, a in ATTACKS for _ in range(COPIES)]
        print("ready", flush=True)
        await stop.wait()
        for t in tasks:
            t.cancel()  # closes the held connections
        await asyncio.gather(*tasks, return_exceptions=True)
    return statuses


def main(argv: list[str]) -> None:
    url, key, model = argv
    statuses = asyncio.run(attack(url, key, model))
    print(json.dumps(statuses), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
