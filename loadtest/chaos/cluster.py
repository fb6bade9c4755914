"""The chaos run's deployment, brought up and taken down whatever happens: a Ray head of our own
(127.0.0.1, free ports, `loadtest.live.deploy`) carrying one simulated node, one more Ray node per
simulated node in `ray_nodes` (`python -m loadtest.live.raynode`, each in a session of its own so it
can be lost by pid), then `serve deploy` of the base config with this run's time scale and state
directory, the router's deployment kept on the head. Every replica is then pinned to the Ray node
that carries its simulated node.

Also the process-level probes the faults need: the process listening on a port, its RSS, and
killing a Ray node's whole session. Never `ray stop`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from isleserve.settings import AppArgs, parse_app_args
from loadtest.chaos.spec import ChaosSpec
from loadtest.live.compare import APP_IMPORT, base_serve_config
from loadtest.live.deploy import (
    ROOT,
    DeployError,
    RayHead,
    free_ports,
    port_in_use,
    ray_env,
    ray_head,
    serve_deploy,
    terminate_cleanly,
    undeploy,
    wait_router,
)
from pools.nodelabels import node_labels, node_resources
from router.config import DEV_KEY
from topology import Topology, read_source
from wire.processes import ChildError, Group, ReadyLine, Stop, session_pids
from wire.supervisor import Child

HEAD_RESOURCE = "node:__internal_head__"
ROUTER_DEPLOYMENT = "isleserve-router"
NODE_START_TIMEOUT_S = 120.0


@dataclass(slots=True)
class ChaosCluster:
    head: RayHead
    args: AppArgs
    topology: Topology
    router_url: str
    router_port: int
    state_dir: Path
    serve_config: Path
    nodes: dict[str, Child] = field(default_factory=dict)
    """Simulated node -> the `loadtest.live.raynode` process (its session) that carries it."""

    def kill_node(self, name: str) -> int:
        """Every process of the Ray node carrying `name`, at once (SIGKILL); how many there were."""
        return kill_session(self.nodes[name].pid)

    def events(self) -> list[dict[str, Any]]:
        path = self.state_dir / "events.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# the configuration
def chaos_args(spec: ChaosSpec, base_config: Path, state_dir: Path, router_port: int = 8000
               ) -> tuple[dict[str, Any], int, AppArgs]:
    """The base Serve config, its application's index, and the args this run deploys."""
    doc, index, base = base_serve_config(base_config)
    raw = base.model_dump(mode="json", exclude_none=True)
    topology = base.topology  # relative: to the working directory, else the repository (as isleserve.app reads it)
    if not Path(topology).is_absolute():
        topology = str(next((b / topology for b in (Path.cwd(), ROOT) if (b / topology).exists()), ROOT / topology))
    raw.update({"time_scale": spec.time_scale, "state_dir": str(state_dir), "topology": topology,
                "engine_admin_routes": True})  # the faults are injected through the engines' admin routes
    raw["router"].update({"host": "127.0.0.1", "port": router_port})
    return doc, index, parse_app_args(raw, f"the chaos configuration from {base_config}")


def write_serve_config(doc: Mapping[str, Any], index: int, args: AppArgs, path: Path) -> Path:
    """The Serve config with these args, its router deployment placed on the head node (Serve
    would otherwise place it on any node, the one about to be lost included)."""
    out = json.loads(json.dumps(doc))
    app = out["applications"][index]
    if app.get("import_path") != APP_IMPORT:
        raise DeployError(f"application {index} of the base config is not {APP_IMPORT}")
    app["args"] = args.model_dump(mode="json", exclude_none=True)
    app["deployments"] = [{"name": ROUTER_DEPLOYMENT, "ray_actor_options": {"num_cpus": 0,
                                                                           "resources": {HEAD_RESOURCE: 0.001}}}]
    path.write_text(yaml.safe_dump(out, sort_keys=False))
    return path


def head_node_args(topology: Topology, name: str | None) -> list[str]:
    """`ray start` options that make the head carry simulated node `name` (what `python -m pools
    node-labels` prints for it)."""
    if name is None:
        return []
    node = topology.node(name)
    return ["--num-gpus", str(len(node.gpus)), "--resources", json.dumps(node_resources(topology, node)),
            "--labels", ",".join(f"{k}={v}" for k, v in node_labels(topology, node).items())]


# Ray nodes of our own
def start_ray_node(head: RayHead, topology: Topology, name: str, log: Path) -> Child:
    node = topology.node(name)
    cmd = [sys.executable, "-m", "loadtest.live.raynode", "--address", head.address, "--num-gpus", str(len(node.gpus)),
           "--resources", json.dumps(node_resources(topology, node)), "--labels",
           json.dumps(node_labels(topology, node))]
    env = {**ray_env(), "RAY_raylet_start_wait_time_s": str(int(NODE_START_TIMEOUT_S))}
    # stopped as it is lost: SIGKILL to its whole session at once
    proc = Child(cmd, name=f"the Ray node for {name}", ready=ReadyLine("ready"), cwd=ROOT, env=env,
                 group=Group.SESSION, stderr=log, stop=Stop(signal=signal.SIGKILL, to_group=True, grace_s=10.0))
    proc.start()
    try:  # "ray node ready: <id>"; it gives up itself after NODE_START_TIMEOUT_S
        proc.wait_ready(2 * NODE_START_TIMEOUT_S, stop_on_failure=False)
    except ChildError as err:
        proc.stop()
        raise DeployError(f"the Ray node for {name} did not start (exit {err.exit_code}); its log: {log}") from None
    return proc


def kill_session(sid: int) -> int:
    pids = session_pids(sid)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)


# probes
def listening_pid(port: int) -> int | None:
    """The process with a TCP socket listening on 127.0.0.1/0.0.0.0:`port` (from /proc)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(cols[9])
    if not inodes:
        return None
    wanted = {f"socket:[{i}]" for i in inodes}
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        with contextlib.suppress(OSError):
            for fd in fd_dir.iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in wanted:
                        return int(fd_dir.parent.name)
    return None


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


# up and down
@contextlib.contextmanager
def chaos_deployment(spec: ChaosSpec, base_config: Path, work_dir: Path,
                     say: Callable[[str], None] = lambda _: None) -> Iterator[ChaosCluster]:
    """The deployment up and answering; on the way out (also on an error, Ctrl-C or SIGTERM):
    `serve shutdown`, the controller stopped, our Ray nodes killed, the head stopped by pid."""
    state_dir = work_dir / "state"
    port = spec.router_port or free_ports(1)[0]
    doc, index, args = chaos_args(spec, base_config, state_dir, port)
    topology = read_source(args.topology)
    config = write_serve_config(doc, index, args, work_dir / "serve-chaos.yaml")
    app = str(doc["applications"][index].get("name", "default"))
    url = f"http://127.0.0.1:{port}"
    if port_in_use(port):
        raise DeployError(f"127.0.0.1:{port} is taken: the chaos deployment's router needs it")
    started = time.monotonic()
    with terminate_cleanly(), ray_head(node_args=head_node_args(topology, spec.head_node)) as head:
        cluster = ChaosCluster(head=head, args=args, topology=topology, router_url=url, router_port=port,
                               state_dir=state_dir, serve_config=config)
        try:
            for name in spec.ray_nodes:
                cluster.nodes[name] = start_ray_node(head, topology, name, work_dir / f"raynode-{name}.log")
                say(f"Ray node for {name} joined ({time.monotonic() - started:.0f} s)")
            serve_deploy(head, config, app, 300)
            wait_router(url, DEV_KEY, 30)
            say(f"deployed and answering after {time.monotonic() - started:.0f} s")
            yield cluster
        finally:
            for problem in undeploy(head):
                say(f"teardown: {problem}")
            for proc in cluster.nodes.values():
                proc.stop()
