"""The KV-path faults of the chaos run (issue 34), done to a running deployment through the decode
engine's POST /admin/faults (`simengine.kvfaults`) for one prefill->decode pair only (`kv_peer`:
the prefill's replica id, its `remote_engine_id`):

    kv_transport_fallback   the pair's KV moves at TCP speed ({"kv_transport": "tcp"}: UCX/NIXL
                            fell back to TCP)
    kv_remote_nic           the pair's KV at `bandwidth_factor` of its rate (NIXL took the NIC on
                            the other socket)

Each strikes, then watches (at most `watch_s`) the router's verdict on the pair, as the observer
polls it from `/admin/replicas` (`kv_paths`): when the pair is first not as_planned (flagged) and
when the router stops choosing it (avoided: `recovered_s`). The fault is lifted `duration_s` after
it struck, else at the end of the run (`FaultContext.lift_all`, also after an error): the pair's
settings back to the engine's defaults.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from loadtest.chaos.faults import FaultContext, Observer, engine_admin_token
from loadtest.chaos.kvreport import first_kv
from loadtest.chaos.spec import KvFault, KvRemoteNic, KvTransportFallback
from wire import client
from wire.client import ClientError

AS_PLANNED = "as_planned"
"""The router's verdict on a pair whose KV moves as its path should (`router.plugins.kvpath`)."""


def fault_body(f: KvFault) -> dict[str, Any]:
    """What the decode engine's /admin/faults is sent to strike the pair."""
    if isinstance(f, KvRemoteNic):
        return {"kv_peer": f.prefill, "kv_bandwidth_factor": f.bandwidth_factor}
    return {"kv_peer": f.prefill, "kv_transport": "tcp"}


def lift_body(f: KvFault) -> dict[str, Any]:
    """What undoes it: the pair's transport and rate back to the engine's defaults."""
    return {"kv_peer": f.prefill, "kv_transport": "default", "kv_bandwidth_factor": 1.0}


def _post(url: str, body: dict[str, Any], key: str | None) -> None:
    client.post_json(url, body, key=key, timeout_s=5)


async def _watch(obs: Observer, pair: str, what: Callable[[dict[str, Any]], bool], until_s: float) -> bool:
    """Whether the router's row for `pair` satisfies `what` before the run clock reaches `until_s`."""
    while obs.now() < until_s:
        row = obs.kv_paths.get(pair)
        if row is not None and what(row):
            return True
        await asyncio.sleep(0.25)
    return False


def _lifter(f: KvFault, ctx: FaultContext, url: str, token: str | None, done: dict[str, Any]
            ) -> Callable[[], Awaitable[None]]:
    async def lift() -> None:
        if "lifted_s" in done:
            return
        done["lifted_s"] = round(ctx.driver.now(), 2)
        now = ctx.observer.table.get(f.decode)  # a restarted decode has a new URL (and no fault)
        with contextlib.suppress(OSError, ClientError):
            await asyncio.to_thread(_post, f"{now.url if now else url}/admin/faults", lift_body(f), token)
    return lift


async def kv_pair_fault(f: KvTransportFallback | KvRemoteNic, ctx: FaultContext) -> dict[str, Any]:
    obs = ctx.observer
    missing = [r for r in (f.decode, f.prefill) if r not in obs.table]
    if missing:
        return {"error": f"{', '.join(missing)} not in the router's table"}
    url, token = obs.table[f.decode].url, engine_admin_token(ctx)
    await asyncio.to_thread(_post, f"{url}/admin/faults", fault_body(f), token)
    at = ctx.driver.now()
    lifted: dict[str, Any] = {}
    lift = _lifter(f, ctx, url, token, lifted)
    ctx.lifts.append(lift)
    timer = None
    if f.duration_s is not None:
        timer = asyncio.create_task(_lift_after(f.duration_s, lift))
    until = at + f.watch_s
    await _watch(obs, f.pair, lambda r: r["verdict"] != AS_PLANNED, until)
    await _watch(obs, f.pair, lambda r: bool(r["avoided"]), until)
    flagged = first_kv(obs.kv_changes, at, f.pair, lambda r: r["verdict"] != AS_PLANNED)
    avoided = first_kv(obs.kv_changes, at, f.pair, lambda r: bool(r["avoided"]))
    if timer is not None and timer.done():
        timer.result()
    return {"at_s": at, "recovered_s": None if avoided is None else avoided[0], "pair": f.pair,
            "decode": f.decode, "prefill": f.prefill, "decode_url": url, "engine_fault": fault_body(f),
            "flagged_s": None if flagged is None else flagged[0],
            "flag_verdict": None if flagged is None else flagged[1]["verdict"],
            "avoided_s": None if avoided is None else avoided[0], "watched_until_s": round(ctx.driver.now(), 2),
            "lifted": "at the end of the run" if f.duration_s is None else f"{f.duration_s:g} s after it struck",
            "router_row_at_end_of_watch": obs.kv_paths.get(f.pair)}


async def _lift_after(delay_s: float, lift: Callable[[], Awaitable[None]]) -> None:
    await asyncio.sleep(delay_s)
    await lift()


ACTIONS: dict[str, Callable[[Any, FaultContext], Awaitable[dict[str, Any]]]] = {
    "kv_transport_fallback": kv_pair_fault, "kv_remote_nic": kv_pair_fault}
