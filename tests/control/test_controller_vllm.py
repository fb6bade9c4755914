"""The controller with `engine: vllm`, over fake vLLM replicas that hold their ports like real
servers would (no vLLM needed): every replica gets its pool's settings and ports no other
replica on its node holds, a port some other process holds is skipped, the routing table names
vLLM's served model, and a restarted controller reattaches on the same ports."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from control.controller import ControllerCore
from control.spec import ControllerSpec, EngineLaunch
from pools.model import PoolSpec
from pools.ports import PortInUse, PortPlan, PortRange
from pools.vllmconfig import VllmSettings
from tests.control.conftest import FakeBackend, controller_spec

pytestmark = pytest.mark.unit


class FakeServer:
    """Holds its ports on its node while it runs, as a vLLM server would."""

    def __init__(self, launch: EngineLaunch, hosts: FakeHosts) -> None:
        self.launch, self.hosts, self.running = launch, hosts, False

    @property
    def ports(self) -> tuple[int, ...]:
        assert self.launch.vllm is not None
        return self.launch.vllm.ports.all()

    def start(self) -> str:
        held = self.hosts.held(self.launch.node)
        for port in self.ports:
            if port in held or (self.launch.node, port) in self.hosts.foreign:
                raise PortInUse(self.launch.node, port)
        self.running = True
        assert self.launch.vllm is not None
        return f"http://10.0.0.{ord(self.launch.node[0])}:{self.launch.vllm.ports.http}"

    def healthy(self) -> bool:
        return self.running

    def ensure(self) -> str:
        return self.start() if not self.running else self.url

    @property
    def url(self) -> str:
        assert self.launch.vllm is not None
        return f"http://10.0.0.{ord(self.launch.node[0])}:{self.launch.vllm.ports.http}"

    def idle(self) -> bool:
        return True

    def stop(self) -> None:
        self.running = False

    def info(self) -> dict[str, Any]:
        return {}


class FakeHosts:
    """Makes the fake vLLM servers, and knows which ports they hold on each node."""

    def __init__(self) -> None:
        self.servers: dict[str, FakeServer] = {}
        self.foreign: set[tuple[str, int]] = set()
        """(node, port) held by processes the controller does not know."""

    def held(self, node: str) -> set[int]:
        return {p for s in self.servers.values() if s.running and s.launch.node == node for p in s.ports}

    def __call__(self, launch: EngineLaunch) -> FakeServer:
        assert launch.vllm is not None, "engine vllm: every replica is a vLLM server"
        self.servers[launch.actor_name] = FakeServer(launch, self)
        return self.servers[launch.actor_name]


Vllm = FakeBackend[FakeServer]


SETTINGS = VllmSettings(model="/models/tiny", served_model_name="tiny", python="/v/bin/python")
POOLS = (PoolSpec(name="prefill", role="prefill", tp=1, replicas=2, model="llama-3.1-8b"),
         PoolSpec(name="decode", role="decode", tp=1, replicas=2, model="llama-3.1-8b"),
         PoolSpec(name="mixed", role="mixed", tp=2, replicas=1, model="llama-3.1-8b"))


def _spec(tmp_path: Path) -> ControllerSpec:
    return controller_spec(tmp_path, *POOLS, engine="vllm", time_scale=1.0, drain_timeout_s=30.0,
                          vllm={p.name: replace(SETTINGS, served_model_name=f"tiny-{p.role}") for p in POOLS},
                          ports=PortPlan(http=PortRange(first=8100, last=8109),
                                         side_channel=PortRange(first=5600, last=5609)))


@pytest.fixture
def hosts() -> FakeHosts:
    return FakeHosts()


@pytest.fixture
def backend(hosts: FakeHosts) -> Vllm:
    """`attach` finds a server only while it runs."""
    return FakeBackend(hosts, attachable=lambda server: server.running)


def _no_shared_ports(core: ControllerCore) -> None:
    by_node: dict[str, list[int]] = {}
    for r in [*core.running.values(), *core.retiring]:
        assert r.launch.vllm is not None
        by_node.setdefault(r.launch.node, []).extend(r.launch.vllm.ports.all())
    for node, ports in by_node.items():
        assert len(ports) == len(set(ports)), f"node {node} hands out a port twice: {sorted(ports)}"


def test_every_vllm_replica_gets_its_settings_and_its_own_ports(tmp_path: Path, backend: Vllm) -> None:
    core = ControllerCore(_spec(tmp_path), backend)
    table = core.deploy()
    assert len(table.replicas) == 5 and {r.model for r in table.replicas} == {"tiny-prefill", "tiny-decode",
                                                                             "tiny-mixed"}
    _no_shared_ports(core)
    for r in core.running.values():
        assert r.launch.vllm is not None and r.launch.vllm.settings.model == "/models/tiny"
        ports = r.launch.vllm.ports
        assert 8100 <= ports.http <= 8109 and r.url.endswith(f":{ports.http}")
        assert (ports.side_channel is None) == (r.placement.role == "mixed")
    saved = json.loads((tmp_path / "state.json").read_text())
    assert {k: v["ports"] for k, v in saved["replicas"].items()} == {
        rid: r.launch.vllm.ports.to_json() for rid, r in core.running.items() if r.launch.vllm is not None}
    started = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert {e["replica_id"] for e in started if e["kind"] == "replica_started" and e["engine"] == "vllm"} == \
        set(core.running)


def test_a_port_another_process_holds_is_skipped(tmp_path: Path, hosts: FakeHosts, backend: Vllm) -> None:
    hosts.foreign = {(node, 8100) for node in ("a", "b")} | {("a", 5600)}
    core = ControllerCore(_spec(tmp_path), backend)
    core.deploy()
    _no_shared_ports(core)
    held = {(r.launch.node, p) for r in core.running.values() if r.launch.vllm for p in r.launch.vllm.ports.all()}
    assert not held & hosts.foreign and len(backend.created) > len(core.running)
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert {(e["node"], e["port"]) for e in events if e["kind"] == "port_in_use"} <= hosts.foreign


def test_a_restarted_controller_reattaches_on_the_same_ports(tmp_path: Path, backend: Vllm) -> None:
    first = ControllerCore(_spec(tmp_path), backend)
    first.deploy()
    before = {rid: (r.url, r.launch.vllm.ports if r.launch.vllm else None) for rid, r in first.running.items()}
    created = len(backend.created)
    second = ControllerCore(_spec(tmp_path), backend)
    second.deploy()
    assert {rid: (r.url, r.launch.vllm.ports if r.launch.vllm else None)
            for rid, r in second.running.items()} == before
    assert len(backend.created) == created  # nothing started twice


def test_a_moved_replica_never_takes_ports_its_predecessor_still_holds(tmp_path: Path,
                                                                       backend: Vllm) -> None:
    core = ControllerCore(_spec(tmp_path), backend)
    core.deploy()
    victim = next(r for r in core.running.values() if r.placement.role == "mixed")
    a, b = victim.placement.gpus
    core.mark_link(victim.placement.node, a, b, reason="test")
    core.settle(timeout_s=30)
    moved = core.running[victim.placement.replica_id]
    assert moved.launch.generation == 1 and victim in core.retiring
    _no_shared_ports(core)
    assert moved.launch.vllm is not None and moved.launch.vllm.settings == victim.launch.vllm.settings  # type: ignore[union-attr]


def test_a_vllm_controller_refuses_pools_without_settings(tmp_path: Path, backend: Vllm) -> None:
    spec = replace(_spec(tmp_path), vllm={"prefill": SETTINGS})
    with pytest.raises(ValueError, match=r"no vLLM settings for pools \['decode', 'mixed'\]"):
        ControllerCore(spec, backend)
