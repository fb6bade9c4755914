"""The product brought up for a live load test, and taken down again whatever happens.

Two ways, one shape (a router URL, its engines' URLs, the deployed plan):

- `ray_deployment(config)`: as an operator deploys it. A Ray head of its own (`ray start --head
  --block` in a new session: its own temp dir, free ports, 127.0.0.1 only, token auth off), then
  `serve deploy` of a Serve config, `serve status` until RUNNING, and the router answering. On the
  way out: `serve shutdown`, `python -m pools stop-controller` (Serve leaves the detached
  controller and its engines), SIGTERM to that `ray start` process, then whatever is still alive
  in its session is killed by pid. Never `ray stop`: it stops every Ray process of the user.
- `direct_deployment(args)`: the same plan without Ray: one `python -m pools sim-engine` per
  placement (the command the controller's replica actors run) and `python -m router --config`.
  Seconds instead of half a minute; what the calibration tests use.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from isleserve.planning import plan_for, resolve_topology
from isleserve.settings import AppArgs
from wire import client
from wire.processes import ChildExited, ChildNotReady, Group, Output, ReadyLine, ReadyUrl, Stop
from wire.supervisor import Child

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
"""No token auth, no usage stats, loopback only, no 30 s drain when the head stops."""
SERVE_CLI_S = 60.0
"""How long one `serve` command (deploy, status) may take."""
PORT_OPTIONS = ("--port", "--dashboard-port", "--ray-client-server-port", "--node-manager-port",
                "--object-manager-port", "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
                "--metrics-export-port", "--runtime-env-agent-port")


class DeployError(Exception):
    """The deployment did not come up (the message says where it stopped and why)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Deployment:
    router_url: str
    """http://127.0.0.1:PORT (no /v1)."""
    engine_urls: Mapping[str, str]
    """Replica id -> engine base URL."""
    plan: dict[str, Any]
    """The placement plan as /admin/plan returns it."""
    ray_head_pid: int | None = None
    """Our `ray start --head` process: its session holds every Ray process and engine we started."""


# helpers shared by both ways
def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


RAY_PORTS = range(20000, 32768)
"""Where the Ray head's own ports are chosen: above Ray's worker ports (10002-19999) and below
Linux's default ephemeral range (32768-60999). A port the kernel handed out, released, can be taken
by any outgoing connection on the machine before `ray start` binds it; a port below that range
can only be taken by another listener. (Ray itself listens in this range only in modes this
project does not use: Ray Client's per-client servers, 23000-23999, for `ray://` clients; Serve's
direct ingress, 30000-31000.)"""


def ray_ports(n: int) -> list[int]:
    """`n` distinct free ports in RAY_PORTS where the kernel's ephemeral range starts above it (as
    Linux's default does), else the kernel's own choice; held together while chosen."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    if low < RAY_PORTS.stop:
        return free_ports(n)
    held: list[socket.socket] = []
    try:
        for port in random.sample(RAY_PORTS, len(RAY_PORTS)):
            if len(held) == n:
                break
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            held.append(s)
        if len(held) < n:
            raise DeployError(f"only {len(held)} of the {n} ports the Ray head needs are free in "
                              f"{RAY_PORTS.start}-{RAY_PORTS.stop - 1}")
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def get_json(url: str, key: str | None = None, timeout_s: float = 5.0) -> Any:
    """A 2xx answer's JSON (wire.client: OSError for no such answer, ValueError for no JSON)."""
    return client.get_json(url, key=key, timeout_s=timeout_s)


def wait_router(url: str, key: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            get_json(f"{url}/v1/models", key, timeout_s=2)
            return
        except (OSError, ValueError) as err:
            if time.monotonic() > deadline:
                raise DeployError(f"the router at {url} did not answer /v1/models within {timeout_s:g} s: "
                                  f"{err}") from None
            time.sleep(0.5)


def _describe(url: str, admin_key: str) -> Deployment:
    plan = get_json(f"{url}/admin/plan", admin_key)
    replicas = get_json(f"{url}/admin/replicas", admin_key)["replicas"]
    return Deployment(router_url=url, engine_urls={r["replica_id"]: r["url"] for r in replicas}, plan=plan)


# Ray: a head of our own, serve deploy, serve status
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RayHead:
    proc: Child
    temp_dir: Path
    dashboard: str
    address: str
    """The GCS address (for `ray.init` and `python -m pools ... --address`)."""

    def said(self) -> str:
        """The end of what `ray start --head` printed (it names a Ray process that died, and the
        end of that process's log), in a line."""
        return " | ".join(line.strip() for line in self.proc.tail()[-12:] if line.strip())[-1500:] or "(nothing)"

    def serve(self, *args: str, timeout_s: float = SERVE_CLI_S) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN / "serve"), *args, "-a", self.dashboard], cwd=ROOT, env=ray_env(),
                              capture_output=True, text=True, timeout=timeout_s, check=False)

    def app_status(self, app: str) -> tuple[dict[str, Any] | None, str]:
        """`serve status` for `app`, and a line saying what it answered (for a deploy that never
        settles: a status, `serve status` failing, or the app not yet there)."""
        try:
            done = self.serve("status")
        except subprocess.TimeoutExpired:
            return None, f"`serve status` did not answer within {SERVE_CLI_S:g} s"
        if done.returncode != 0 or not done.stdout.strip():
            said = (done.stderr.strip().splitlines() or ["(nothing)"])[-1][-400:]
            return None, f"`serve status` exited with {done.returncode}: {said}"
        try:
            found = yaml.safe_load(done.stdout)["applications"][app]
        except (KeyError, TypeError, yaml.YAMLError):
            return None, f"`serve status` lists no application {app!r}: {done.stdout.strip()[-400:]}"
        return (found, _described(found)) if isinstance(found, dict) else (None, f"{app}: {found!r}")


def _described(status: dict[str, Any]) -> str:
    """An application's status in a line: its own, then each deployment's and why."""
    def line(text: object) -> str:
        return " ".join(str(text or "").split())[-300:]

    parts = [f"{status.get('status')} {line(status.get('message'))}".strip()]
    for name, d in (status.get("deployments") or {}).items():
        if isinstance(d, dict):
            parts.append(f"{name}: {d.get('status')} {line(d.get('message'))}".strip())
    return "; ".join(parts)


def ray_env() -> dict[str, str]:
    return {**os.environ, **RAY_ENV}


@contextlib.contextmanager
def terminate_cleanly() -> Iterator[None]:
    """SIGTERM becomes SystemExit while a deployment is up, so that its teardown still runs."""
    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    try:
        previous = signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def ray_head(num_cpus: int = 2, timeout_s: float = 90, node_args: Sequence[str] = ()) -> Iterator[RayHead]:
    """A Ray head of our own, stopped (with everything it started) on the way out. `node_args`:
    more `ray start` options (the chaos run declares a simulated node's labels and resources)."""
    for tool in ("ray", "serve"):
        if not (BIN / tool).exists():
            raise DeployError(f"{BIN / tool} not found: install the project with Ray Serve (pip install -e .)")
    temp_dir = Path(tempfile.mkdtemp(prefix="isle-ray-", dir="/tmp"))  # short: Ray's socket paths live here
    ports = dict(zip(PORT_OPTIONS, ray_ports(len(PORT_OPTIONS)), strict=True))
    cmd = [str(BIN / "ray"), "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--dashboard-host",
           "127.0.0.1", "--temp-dir", str(temp_dir), "--num-cpus", str(num_cpus), "--disable-usage-stats",
           *node_args,
           *(x for option, port in ports.items() for x in (option, str(port)))]
    dashboard = f"http://127.0.0.1:{ports['--dashboard-port']}"
    # stopped by SIGTERM to `ray start` (it stops the head's processes), then what is left of its
    # session is killed by pid
    proc = Child(cmd, name="ray start --head", ready=ReadyUrl(f"{dashboard}/api/version"), cwd=ROOT, env=ray_env(),
                 group=Group.SESSION, stdout=Output.CAPTURE, stderr=Output.STDOUT,
                 stop=Stop(grace_s=60.0, linger_s=20.0)).start()
    head = RayHead(proc=proc, temp_dir=temp_dir, dashboard=dashboard, address=f"127.0.0.1:{ports['--port']}")
    try:
        try:
            proc.wait_ready(timeout_s, poll_s=1.0, stop_on_failure=False)
        except ChildExited as err:
            raise DeployError(f"ray start --head exited with {err.exit_code}: {head.said()}") from None
        except ChildNotReady:
            raise DeployError(f"the Ray head's dashboard did not answer within {timeout_s:g} s") from None
        yield head
    finally:
        stop_head(head)


def stop_head(head: RayHead, grace_s: float = 20) -> None:
    """SIGTERM to our `ray start` (it stops the head's processes), then kill what is left of its
    session by pid (after `grace_s`), and remove its temp dir."""
    head.proc.stop(linger_s=grace_s)
    shutil.rmtree(head.temp_dir, ignore_errors=True)


def serve_deploy(head: RayHead, config: Path, app: str, timeout_s: float) -> dict[str, Any]:
    """`serve deploy` (it only sends the request), then `serve status` until this deploy settles."""
    sent_at = time.time()
    try:
        done = head.serve("deploy", str(config))
    except subprocess.TimeoutExpired:
        raise DeployError(f"serve deploy {config} did not return within {SERVE_CLI_S:g} s") from None
    if done.returncode != 0:
        raise DeployError(f"serve deploy {config} failed: {done.stderr.strip()[-800:]}")
    deadline = time.monotonic() + timeout_s
    said = "`serve status` not asked yet"
    while time.monotonic() < deadline:
        if (code := head.proc.poll()) is not None:
            raise DeployError(f"the Ray head (`ray start --head`) exited with {code} while the deploy settled: "
                              f"{head.said()}; `serve status` last said: {said}")
        status, said = head.app_status(app)
        if status is not None and float(status.get("last_deployed_time_s") or 0) < sent_at - 1:
            said = f"an earlier deploy's status (this one not picked up yet): {said}"
        elif status is not None:
            if status.get("status") == "RUNNING":
                return status
            if status.get("status") == "DEPLOY_FAILED":
                failed = "; ".join(f"{name}: {str(d.get('message', '')).strip()[-1500:]}"
                                   for name, d in (status.get("deployments") or {}).items()
                                   if isinstance(d, dict) and d.get("status") not in ("HEALTHY", "UPDATING"))
                raise DeployError(f"serve status: DEPLOY_FAILED: {str(status.get('message', '')).strip()[-500:]}"
                                  + (f" ({failed})" if failed else ""))
        time.sleep(2)
    raise DeployError(f"serve status did not reach RUNNING within {timeout_s:g} s; it last said: {said}")


def undeploy(head: RayHead) -> list[str]:
    """`serve shutdown` then `python -m pools stop-controller`; problems come back as lines."""
    problems = []
    try:
        done = head.serve("shutdown", "-y", timeout_s=90)
        if done.returncode != 0:
            problems.append(f"serve shutdown: {done.stderr.strip()[-300:]}")
    except subprocess.TimeoutExpired:
        problems.append("serve shutdown did not finish within 90 s")
    try:
        stop = subprocess.run([sys.executable, "-m", "pools", "stop-controller", "--address", head.address], cwd=ROOT,
                              env=ray_env(), capture_output=True, text=True, timeout=120, check=False)
        if stop.returncode != 0:
            problems.append(f"pools stop-controller: {stop.stderr.strip()[-300:]}")
    except subprocess.TimeoutExpired:
        problems.append("pools stop-controller did not finish within 120 s")
    return problems


@contextlib.contextmanager
def ray_deployment(serve_config: Path, app: str, router_url: str, key: str, admin_key: str,
                   timeout_s: float = 240) -> Iterator[Deployment]:
    """A head of our own, the Serve config deployed on it and answering; all of it gone afterwards."""
    port = int(router_url.rsplit(":", 1)[1])
    if port_in_use(port):
        raise DeployError(f"127.0.0.1:{port} is taken: the deployment's router needs it (stop what holds it, or "
                          "pick another with --router-port)")
    with terminate_cleanly(), ray_head() as head:
        try:
            serve_deploy(head, serve_config, app, timeout_s)
            wait_router(router_url, key, 30)
            yield dataclasses.replace(_describe(router_url, admin_key), ray_head_pid=head.proc.pid)
        finally:
            if head.proc.poll() is None:  # a dead head has nothing to shut down: its session is killed next
                for problem in undeploy(head):
                    print(f"teardown: {problem}", file=sys.stderr)


# direct: the same plan's engines and router as plain processes
@dataclasses.dataclass(slots=True)
class _Proc:
    proc: Child
    url: str = ""


def _start(cmd: list[str]) -> _Proc:
    return _Proc(proc=Child(cmd, ready=ReadyLine("ready:"), cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            stop=Stop(grace_s=10.0)).start())


def _ready(p: _Proc, what: str, deadline: float) -> None:
    try:
        line = p.proc.wait_ready(max(0.0, deadline - time.monotonic()), poll_s=0.2, stop_on_failure=False)
    except ChildExited as err:
        last = "\n".join(err.tail).strip()[-500:]
        raise DeployError(f"{what} exited with {err.exit_code}: {last}") from None
    except ChildNotReady:
        raise DeployError(f"{what} did not become ready") from None
    p.url = line.split("ready:")[1].strip().removesuffix("/v1")


def _stop(p: _Proc) -> None:
    p.proc.stop()  # SIGTERM, SIGKILL after 10 s


def _stop_all(procs: dict[str, _Proc]) -> None:
    if "router" in procs:  # first: no request goes to an engine that is stopping
        _stop(procs.pop("router"))
    for proc in procs.values():
        _stop(proc)


@contextlib.contextmanager
def direct_deployment(args: AppArgs, work_dir: Path, timeout_s: float = 60) -> Iterator[Deployment]:
    """The plan `args` would deploy, as engine and router processes on loopback (no Ray)."""
    from control.spec import EngineLaunch

    topology = resolve_topology(args, base=ROOT)
    plan = plan_for(args, topology)
    pools = {p.name: p for p in plan.pools}
    source = str(Path(args.topology) if Path(args.topology).is_absolute() else (ROOT / args.topology))
    procs: dict[str, _Proc] = {}
    with contextlib.ExitStack() as stack:
        stack.enter_context(terminate_cleanly())
        stack.callback(_stop_all, procs)
        deadline = time.monotonic() + timeout_s
        for p in plan.placements:
            gpu = topology.node(p.node).gpu(p.gpus[0]).model or ""
            launch = EngineLaunch(replica_id=p.replica_id, pool=p.pool, role=p.role, model=str(pools[p.pool].model),
                                  gpu=gpu, tp=pools[p.pool].tp, node=p.node, gpus=p.gpus, topology_source=source,
                                  time_scale=args.time_scale)
            procs[p.replica_id] = _start([sys.executable, *launch.command()])
        for rid, proc in procs.items():
            _ready(proc, f"engine {rid}", deadline)
        replicas = [{"replica_id": p.replica_id, "url": procs[p.replica_id].url, "model": str(pools[p.pool].model),
                     "pool": p.pool, "role": p.role, "node": p.node, "gpus": list(p.gpus), "tier": p.tier,
                     "tp": pools[p.pool].tp, "gpu_model": topology.node(p.node).gpu(p.gpus[0]).model,
                     "catalog_model": pools[p.pool].model} for p in plan.placements]
        router = args.router.model_dump(mode="json", exclude_none=True)
        router.update({"host": "127.0.0.1", "port": 0, "topology": source, "replicas": replicas})
        if not router.get("slo_classes"):
            router["slo_classes"] = [c.model_dump(mode="json", exclude_none=True) for c in args.slo_classes]
        config = work_dir / "router.yaml"
        config.write_text(yaml.safe_dump(router, sort_keys=False))
        procs["router"] = _start([sys.executable, "-m", "router", "--config", str(config)])
        _ready(procs["router"], "router", deadline)
        yield Deployment(router_url=procs["router"].url, plan=plan.to_json(),
                         engine_urls={rid: p.url for rid, p in procs.items() if rid != "router"})
