"""The control plane's test kit: the one fake backend the controller tests run on, the fake
replicas it can hand out (starts the test holds, starts that fail), and the one builder of the
spec they deploy (the two 4-GPU pair nodes of tests/data/pairs-cluster.yaml)."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

import pytest

from control.backend import Discovery, LocalBackend, Replica
from control.nodecheck import RayNode
from control.replicas.sim import ReplicaProcess
from control.spec import ControllerSpec, EngineLaunch
from pools.model import PoolSpec
from tests.conftest import ROOT

PAIRS = str(ROOT / "tests/data/pairs-cluster.yaml")
"""Two nodes a and b, 4x A30 each in two NVLink pairs."""
ALL_CLASSES = ("interactive", "standard", "batch")
SLOW_START_S = 10.0
"""A held start gives up after this long (the code before starts ran beside the loop waited for
it inside a pass: the tests then fail instead of hanging)."""

R = TypeVar("R", bound=Replica)


def mixed_pool(replicas: int = 2, *, tp: int = 2, slo_classes: tuple[str, ...] = ALL_CLASSES) -> PoolSpec:
    """The pool most controller tests deploy: mixed llama-3.1-8b, TP 2."""
    return PoolSpec(name="mixed", role="mixed", tp=tp, replicas=replicas, model="llama-3.1-8b",
                    slo_classes=slo_classes)


def controller_spec(state_dir: Path | str, *pools: PoolSpec, source: Path | str = PAIRS, engine: str = "sim",
                    time_scale: float = 0.05, drain_timeout_s: float = 5, counters_interval_s: float = 0,
                    **fields: Any) -> ControllerSpec:
    """The spec the controller tests deploy: island-aligned on `source` (the pair nodes), engines
    20x fast, no counters pass, drains bounded at 5 s, the mixed pool unless `pools` are given;
    `fields` set any other ControllerSpec field."""
    return ControllerSpec(topology_source=str(source), engine=engine, policy="island-aligned",
                          pools=pools or (mixed_pool(),), time_scale=time_scale, state_dir=str(state_dir),
                          counters_interval_s=counters_interval_s, drain_timeout_s=drain_timeout_s, **fields)


class FakeBackend(LocalBackend, Generic[R]):
    """The controller tests' backend: LocalBackend's discovery (a cluster spec) and replicas made
    by `make` (real simulated engine processes on loopback unless told otherwise), every one kept
    by its actor name as detached replica actors outlive a controller actor, so that `attach` finds
    it again (when `attachable` says so: a fake vLLM server only while it runs, say).

    `nodes` binds those topology nodes to Ray nodes the test can take away (`alive[name] =
    False`; none: no Ray nodes at all, as a plain local run); `source` swaps the spec that
    discovery reads (link counters the test rewrites, as NVML's would change)."""

    def __init__(self, make: Callable[[EngineLaunch], R], *, nodes: Sequence[str] = (),
                 source: Path | None = None, attachable: Callable[[R], bool] = lambda _: True) -> None:
        self.make, self.attachable, self.source = make, attachable, source
        self.binds = bool(nodes)
        self.alive = dict.fromkeys(nodes, True)
        self.by_name: dict[str, R] = {}
        self.created: list[EngineLaunch] = []

    def session(self) -> str:
        return "test-session"

    def discover(self, source: str) -> Discovery:
        found = super().discover(source if self.source is None else str(self.source))
        if not self.binds:
            return found
        bound = {n: RayNode(node_id=f"ray-{n}") for n, up in self.alive.items() if up}
        return Discovery(topology=found.topology, bindings=bound, simulated=True)

    def nodes(self) -> list[RayNode] | None:
        if not self.binds:
            return super().nodes()
        return [RayNode(node_id=f"ray-{n}", alive=up) for n, up in self.alive.items()]

    def create(self, launch: EngineLaunch) -> Replica:
        self.created.append(launch)
        self.by_name[launch.actor_name] = self.make(launch)
        return self.by_name[launch.actor_name]

    def attach(self, launch: EngineLaunch) -> Replica | None:
        found = self.by_name.get(launch.actor_name)
        return found if found is not None and self.attachable(found) else None

    def stop_all(self) -> None:
        for replica in self.by_name.values():
            replica.stop()


def engine_backend(**kwargs: Any) -> FakeBackend[ReplicaProcess]:
    """A FakeBackend of real simulated engines (child processes on loopback)."""
    return FakeBackend(ReplicaProcess, **kwargs)


@pytest.fixture
def engines() -> Iterator[FakeBackend[ReplicaProcess]]:
    """A FakeBackend of real simulated engines; every engine it started is stopped afterwards."""
    backend = engine_backend()
    yield backend
    backend.stop_all()
    assert all(r.proc is None or r.proc.poll() is not None for r in backend.by_name.values())


class FakeReplica:
    """A replica without a process: up once started, its start held while its event is unset
    (an engine that takes 60 s to load, without waiting 60 s)."""

    def __init__(self, launch: EngineLaunch, held: threading.Event | None, interruptible: bool) -> None:
        self.launch, self.held, self.interruptible = launch, held, interruptible
        self.alive, self.actor_dead = False, False
        self.stopped = threading.Event()

    @property
    def url(self) -> str:
        return f"http://fake/{self.launch.actor_name}"

    def start(self) -> str:
        if self.held is not None and not self.held.wait(SLOW_START_S):
            raise RuntimeError("took 60 s")
        if self.interruptible and self.stopped.is_set():
            raise RuntimeError("stopped while starting")
        self.alive = True
        self.stopped.clear()
        return self.url

    def healthy(self) -> bool:
        return self.alive

    def ensure(self) -> str:
        if self.actor_dead:
            raise RuntimeError("actor died")
        return self.url if self.alive else self.start()

    def idle(self) -> bool:
        return True

    def stop(self) -> None:
        self.alive = False
        self.stopped.set()
        if self.interruptible and self.held is not None:
            self.held.set()  # as a killed actor ends its start

    def info(self) -> dict[str, Any]:
        return {}


class NoStart(FakeReplica):
    def start(self) -> str:
        raise RuntimeError("engine did not start")


class HeldStarts:
    """Makes FakeReplicas: a start the test holds by (replica id, generation) waits for its
    event; the actors named in `fail` never start; `interruptible`: a stop ends a held start."""

    def __init__(self) -> None:
        self.held: dict[tuple[str, int], threading.Event] = {}
        self.fail: set[str] = set()
        self.interruptible = False

    def hold(self, replica_id: str, generation: int) -> threading.Event:
        return self.held.setdefault((replica_id, generation), threading.Event())

    def release_all(self) -> None:
        for held in self.held.values():
            held.set()

    def __call__(self, launch: EngineLaunch) -> FakeReplica:
        if launch.actor_name in self.fail:
            return NoStart(launch, None, False)
        return FakeReplica(launch, self.held.get((launch.replica_id, launch.generation)), self.interruptible)


def events(state_dir: Path, kind: str | None = None) -> list[dict[str, Any]]:
    """The controller's events.jsonl in `state_dir`, all of them or those of one kind."""
    found = [json.loads(line) for line in (state_dir / "events.jsonl").read_text().splitlines()]
    return [e for e in found if kind is None or e["kind"] == kind]


def health_status(url: str) -> int:
    """An engine's /health status code."""
    with urllib.request.urlopen(f"{url}/health", timeout=5) as resp:
        return int(resp.status)
