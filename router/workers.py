"""Router workers: `workers: N` processes of the same router on one port (SO_REUSEPORT), so a
burst of synchronised streams is relayed by every core instead of queueing behind one event loop.

The leader (the standalone process, or the Serve replica's router thread) starts the others as
`python -m router.worker DIR INDEX`, handing them its config and its view (routing table,
topology, plan, and whether it hears from its controller) through files in DIR, a private
directory (mode 0700). It pushes every newer view to them (and the controller's silence when it
changes), restarts one that dies, and stops them when it stops; a worker whose leader is gone
stops too. Every worker listens on `DIR/INDEX.sock` for its siblings: `GET /internal/metrics`
(its series: whichever worker answers a scrape adds its siblings' and shows one view) and
`PUT /internal/view`. Per-class concurrency limits are divided between the workers: the kernel
spreads connections evenly over SO_REUSEPORT listeners.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from pools.routing import ReplicaEndpoint, RoutingTable
from router.contact import Silence
from topology import Topology
from topology.serialize import from_dict, to_dict
from wire.processes import ChildError, Output, ReadyLine, Stop
from wire.supervisor import Child

log = logging.getLogger("isleserve.router")
START_TIMEOUT_S = 30.0
PEER_TIMEOUT_S = 3.0
"""A sibling that does not answer a scrape within this counts with its last answer (under
Prometheus's default 10 s scrape timeout)."""
RESTART_BACKOFF_S = 2.0
CONFIG_FILE, VIEW_FILE = "config.json", "view.json"


# the view: what the leader learns from its controller and every worker routes with
def view_bytes(table: RoutingTable, topology: Topology | None, plan: Mapping[str, Any] | None,
               silence: Silence | None = None) -> bytes:
    """`silence`: the leader has not heard from its controller (router.contact); a worker takes it
    whatever the table's version."""
    return orjson.dumps({"table": {"version": table.version, "topology_fingerprint": table.topology_fingerprint,
                                   "epoch": table.epoch,
                                   "replicas": [dataclasses.asdict(r) for r in table.replicas]},
                         "topology": to_dict(topology) if topology is not None else None, "plan": plan,
                         "silence": silence.to_json() if silence is not None else None})


def read_view(raw: bytes) -> tuple[RoutingTable, Topology | None, dict[str, Any] | None]:
    view = orjson.loads(raw)
    t = view["table"]
    replicas = tuple(ReplicaEndpoint(**{**r, "gpus": tuple(r.get("gpus", ())),
                                        "slo_classes": tuple(r.get("slo_classes", ()))}) for r in t["replicas"])
    table = RoutingTable(version=int(t["version"]), replicas=replicas,
                         topology_fingerprint=str(t.get("topology_fingerprint", "")), epoch=str(t.get("epoch", "")))
    topology = from_dict(view["topology"]) if view.get("topology") is not None else None
    return table, topology, view.get("plan")


def read_silence(raw: bytes) -> Silence | None:
    return Silence.from_json(orjson.loads(raw).get("silence"))


def socket_path(directory: Path, index: int) -> str:
    return str(directory / f"{index}.sock")


# talking to a sibling over its Unix socket (HTTP/1.1, one request per connection)
async def call(path: str, method: str, route: str, body: bytes = b"", timeout_s: float = PEER_TIMEOUT_S) -> bytes:
    """The body of a 200 answer; OSError for anything else (no answer, refused, not 200)."""
    async def exchange() -> bytes:
        reader, writer = await asyncio.open_unix_connection(path)
        try:
            writer.write(f"{method} {route} HTTP/1.1\r\nhost: worker\r\nconnection: close\r\n"
                         f"content-length: {len(body)}\r\n\r\n".encode() + body)
            status = await reader.readline()
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            payload = await reader.readexactly(length)
        finally:
            writer.close()
        if not status.startswith(b"HTTP/1.1 200"):
            raise OSError(f"{route}: {status.decode('latin-1').strip()}")
        return payload

    try:
        return await asyncio.wait_for(exchange(), timeout_s)
    except (TimeoutError, asyncio.IncompleteReadError, ValueError) as err:
        raise OSError(f"{route}: {err or type(err).__name__}") from None


class Siblings:
    """The other workers of this router, reached through their sockets."""

    def __init__(self, directory: Path, index: int, count: int) -> None:
        self.directory, self.index, self.count = directory, index, count
        self.last: dict[int, dict[str, Any]] = {}
        """Each sibling's latest snapshot: a busy one that misses a scrape counts with it, so
        the view's counters never step back."""

    def others(self) -> list[int]:
        return [i for i in range(self.count) if i != self.index]

    async def snapshots(self) -> list[dict[str, Any]]:
        """Every sibling's metrics snapshot: fresh, or its last one when it did not answer in
        time (a slow or restarting worker never fails the scrape)."""
        answers = await asyncio.gather(*(call(socket_path(self.directory, i), "GET", "/internal/metrics")
                                         for i in self.others()), return_exceptions=True)
        out = []
        for i, a in zip(self.others(), answers, strict=True):
            if isinstance(a, BaseException):
                log.debug("worker %d did not answer this scrape (%s): its last snapshot counts", i, a)
            else:
                self.last[i] = orjson.loads(a)
            if i in self.last:
                out.append(self.last[i])
        return out


LEADER_GONE_SIGNAL = signal.SIGHUP
"""What a worker gets when the thread that started it ends (its leader died without stopping it;
a stop asked by the leader is SIGTERM): it stops and removes the private directory itself."""


class Workers:
    """The leader's side: starts, feeds, restarts and stops workers 1..count-1."""

    def __init__(self, config_json: str, count: int) -> None:
        self.count = count
        self.directory = Path(tempfile.mkdtemp(prefix="isle-router-"))  # 0700: our siblings only
        (self.directory / CONFIG_FILE).write_text(config_json)
        self.procs: dict[int, Child] = {}
        self.started_at: dict[int, float] = {}
        self.view = b""
        self._watch: asyncio.Task[None] | None = None
        self._stopping = False

    async def start(self, view: bytes) -> None:
        self.set_view(view)
        await asyncio.gather(*(self._spawn(i) for i in range(1, self.count)))
        self._watch = asyncio.get_running_loop().create_task(self._supervise())

    def set_view(self, view: bytes) -> None:
        self.view = view
        tmp = self.directory / (VIEW_FILE + ".tmp")
        tmp.write_bytes(view)
        tmp.replace(self.directory / VIEW_FILE)  # a restarted worker starts from the newest view

    async def _spawn(self, index: int) -> None:
        proc = Child([sys.executable, "-m", "router.worker", str(self.directory), str(index)],
                     name=f"router worker {index}", ready=ReadyLine("ready"), stderr=Output.INHERIT,
                     parent_death=LEADER_GONE_SIGNAL, stop=Stop(grace_s=5.0)).start()
        self.procs[index], self.started_at[index] = proc, time.monotonic()
        try:
            await proc.wait_ready_async(START_TIMEOUT_S)  # stopped when it does not come up
        except ChildError as err:
            raise RuntimeError(f"router worker {index} did not start (exit status {err.exit_code}); "
                               "its stderr is above") from None

    async def _supervise(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            for index, proc in list(self.procs.items()):
                if proc.poll() is None or self._stopping:
                    continue
                wait = RESTART_BACKOFF_S - (time.monotonic() - self.started_at[index])
                log.warning("router worker %d exited with %s; restarting it", index, proc.returncode)
                if wait > 0:
                    await asyncio.sleep(wait)
                try:
                    await self._spawn(index)
                except (RuntimeError, OSError) as err:
                    log.error("router worker %d: %s", index, err)

    async def push(self, view: bytes) -> None:
        """A newer view to every worker (and to the file a restarted one reads)."""
        self.set_view(view)
        for i in range(1, self.count):
            try:
                await call(socket_path(self.directory, i), "PUT", "/internal/view", view, timeout_s=5.0)
            except OSError as err:
                log.warning("router worker %d did not take the new view: %s", i, err)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs.values() if p.poll() is None]

    async def stop(self, grace_s: float = 5.0) -> None:
        self._stopping = True
        if self._watch is not None:
            self._watch.cancel()
        for proc in self.procs.values():
            proc.terminate()  # all at once; then each has `grace_s` before SIGKILL
        for proc in self.procs.values():
            await asyncio.to_thread(proc.stop, grace_s)
        shutil.rmtree(self.directory, ignore_errors=True)


def leader_alive(parent: int) -> bool:
    """Whether the process that started this worker still runs (not exited, not a zombie)."""
    if os.getppid() != parent:
        return False
    try:
        state = Path(f"/proc/{parent}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


async def leader_gone(parent: int) -> None:
    """Returns when the process that started this worker is gone (then the worker stops)."""
    while leader_alive(parent):
        await asyncio.sleep(1.0)
