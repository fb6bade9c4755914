"""`import_path: isleserve.app:build` — the Ray Serve application of configs/local.yaml and prod.yaml.

`build(args)` validates the product's args (every problem at once; a failed build shows up in
`serve status` with that message), then binds one deployment. Its replica gets or creates the
detached controller (which plans and starts the engines), and runs the router on its own
listener (Ray Serve's proxy is disabled: its extra hop costs milliseconds) in a thread with
its own event loop, following the controller's routing table.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from control.benches.schedule import BenchPolicy
from control.spec import AutoscaleSpec, ControllerSpec
from isleserve.raysecurity import bind_serve_grpc_to_node, check_exposure
from isleserve.run import ready_line
from isleserve.settings import AppArgs, parse_app_args
from pools.routing import RoutingTable
from pools.sizing import parse_workload
from router.contact import ControllerContact
from router.server import Router
from wire import native

REPO = Path(__file__).resolve().parents[1]
FOLLOW_INTERVAL_S = 1.0
CONTROLLER_TIMEOUT_S = 5.0
"""How long one call to the controller may take: an actor that Ray is restarting blocks `ray.get`,
and the follow loop must keep ticking to say the controller is silent (router.contact)."""
START_TIMEOUT_S = 120.0
"""How long a Serve replica waits for its router to listen (seconds alone; two loaded cores
beside other deployments can take far longer)."""
ENGINE_KEY_ENV = "ISLE_ROUTER_ENGINE_KEY"
"""Where the router finds the engines' key (RouterConfig.upstream.key_env)."""
log = logging.getLogger("isleserve.serve")


def _absolute(source: str) -> str:
    """Relative paths (a topology source, vLLM's environment or model directory) are relative to
    the working directory, else to the repository (`serve deploy` builds the app in Ray's
    processes, whose working directory is elsewhere); what exists in neither stays as it is (a
    Hugging Face model id)."""
    if source == "nvml" or Path(source).is_absolute():
        return source
    for base in (Path.cwd(), REPO):
        if (base / source).exists():
            return str(base / source)
    return source


def controller_spec(args: AppArgs) -> ControllerSpec:
    config = args.pools_config()
    vllm = {pool: replace(s, log_dir=s.log_dir or str(Path(args.state_dir) / "vllm-logs"))
            for pool, s in args.vllm_settings(_absolute).items()}
    bench = BenchPolicy(on_change=args.bench_on_change, interval_s=args.bench_interval_s,
                        size_bytes=int(args.bench_size_mib * (1 << 20)) if args.bench_size_mib else None,
                        iters=args.bench_iters)
    prompt, output = parse_workload(args.workload)
    loop = args.autoscaling
    autoscale = AutoscaleSpec(pools=config.autoscaling(), interval_s=loop.interval_s, look_back_s=loop.look_back_s,
                              window_s=loop.window_s, drain_timeout_s=loop.drain_timeout_s, prompt_tokens=prompt,
                              output_tokens=output)
    return ControllerSpec(topology_source=_absolute(args.topology), engine=args.engine, policy=args.policy,
                          pools=config.pool_specs(), slo_classes=config.classes(), time_scale=args.time_scale,
                          state_dir=args.state_dir, counters_interval_s=args.counters_interval_s,
                          drain_timeout_s=args.drain_timeout_s, vllm=vllm, ports=args.vllm.ports.plan(), bench=bench,
                          autoscale=autoscale, engine_admin_routes=args.engine_admin_routes,
                          engine_args=args.engine_args(),
                          kv_events_endpoint=args.router.kv_events.endpoint if args.router.kv_events else "",
                          kv_block_size=args.router.kv_events.block_size if args.router.kv_events else 16,
                          kv_path_action=args.kv_path_action.policy())


class RouterThread:
    """The router's own event loop, in a thread of the Serve replica."""

    def __init__(self, args: AppArgs, controller: Any) -> None:
        import ray

        self.ray, self.controller = ray, controller
        table: RoutingTable = ray.get(controller.deploy.remote())
        plan = ray.get(controller.plan.remote())
        topology = ray.get(controller.topology.remote())
        # the engines' key, for this process and the router workers it starts (never in a config)
        os.environ[ENGINE_KEY_ENV] = ray.get(controller.engine_api_key.remote())
        upstream = args.router.upstream.model_copy(update={"key_env": ENGINE_KEY_ENV})
        self.router = Router(args.router.model_copy(update={"upstream": upstream}), table, topology, plan)
        self.router.contact = ControllerContact()  # it just answered
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.follower: asyncio.Task[None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=self._run, name="isleserve-router", daemon=True)
        self.thread.start()
        # a start that fails says so at once (`_run` sets ready with the error); this bounds a slow
        # one only, and Serve tries a raised constructor again thrice before DEPLOY_FAILED
        if not self.ready.wait(START_TIMEOUT_S):
            raise RuntimeError(f"the router did not start within {START_TIMEOUT_S:g} s")
        if self.error is not None:
            raise RuntimeError(f"the router did not start: {self.error}")
        log.info("request path: %s", native.explain())
        log.info(ready_line(args.router.host, self.router.port, len(table.replicas)))

    def _run(self) -> None:
        try:
            import uvloop

            loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        except ImportError:
            loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self.router.start())
        except BaseException as err:  # a port already taken, for instance: report it to Serve
            self.error = err
            try:  # what it started before it failed, then the loop itself (its self-pipe's sockets)
                loop.run_until_complete(self.router.stop())
            except Exception:
                log.exception("stopping a router that did not start")
            loop.close()
            self.ready.set()
            return
        self.ready.set()
        self.loop = loop
        self.follower = loop.create_task(self._follow())
        loop.run_forever()
        loop.close()

    async def _follow(self) -> None:
        """Every second: a newer table (and with it the plan and topology the admin API shows),
        and the router's load report to the controller's autoscaler (its status comes back for
        the `isle_autoscale_*` metrics). Each call has a timeout; the router counts the time
        since the controller last answered and says it is degraded past a limit."""
        contact = self.router.contact
        assert contact is not None
        while True:
            await asyncio.sleep(FOLLOW_INTERVAL_S)
            try:
                table: RoutingTable = await self._get(self.controller.table.remote())
                contact.answered()
                if table.supersedes(self.router.replicas.table):  # a restarted controller: any version
                    plan, topology = await self._get([self.controller.plan.remote(),
                                                      self.controller.topology.remote()])
                    await self.router.set_view(table, topology, plan)  # and to the router's other workers
                report = await self.router.load_report()
                status: Any = await self._get(self.controller.observe.remote(report.to_json()))
                self.router.metrics.autoscaling = dict(status)
            except self.ray.exceptions.RayError as err:  # a controller restarting: keep the last table
                contact.failed(err)
                log.warning("following the controller's routing table: %s", err)
            await self.router.set_silence(contact.silence())  # to the router's other workers when it changes

    async def _get(self, refs: Any) -> Any:
        """`ray.get` in a thread, within CONTROLLER_TIMEOUT_S (GetTimeoutError: a RayError)."""
        get = functools.partial(self.ray.get, refs, timeout=CONTROLLER_TIMEOUT_S)
        return await asyncio.get_running_loop().run_in_executor(None, get)

    def alive(self) -> bool:
        return self.thread.is_alive() and self.error is None

    def stop(self, timeout_s: float = 10.0) -> None:
        """Close the listener and end the thread (the Serve replica's process usually just ends)."""
        loop = self.loop
        if loop is None or not self.thread.is_alive():
            return

        async def _stop() -> None:
            if self.follower is not None:
                self.follower.cancel()
            await self.router.stop()
            await asyncio.sleep(0.05)  # let cancelled tasks finish
            loop.stop()

        asyncio.run_coroutine_threadsafe(_stop(), loop)
        self.thread.join(timeout_s)


def build(args: dict[str, Any]) -> Any:
    from ray import serve

    from control.actors import HEAD_RESOURCE, get_or_create_controller

    app_args = parse_app_args(args)
    check_exposure(app_args.insecure)
    spec = controller_spec(app_args)

    class IsleServe:
        def __init__(self, raw: dict[str, Any]) -> None:
            bind_serve_grpc_to_node()  # before Serve opens this replica's gRPC port
            self.args = parse_app_args(raw)
            self.router = RouterThread(self.args, get_or_create_controller(spec))
            self.started = time.time()

        async def __call__(self, request: Any) -> dict[str, Any]:
            return {"router": f"http://{self.args.router.host}:{self.router.router.port}/v1"}

        def check_health(self) -> None:
            if not self.router.alive():
                raise RuntimeError("the isleserve router thread stopped")

        def __del__(self) -> None:  # Serve calls it when it stops the replica: the port and workers go too
            router = getattr(self, "router", None)
            if router is not None:
                router.stop()

    # on the head node, with the controller: its listener is on that host's loopback, and so is the
    # KV-event subscriber the controller's engines on that host publish to
    deployment: Any = serve.deployment(name="isleserve-router", num_replicas=1,
                                       ray_actor_options={"num_cpus": 0, "resources": {HEAD_RESOURCE: 0.001}}
                                       )(IsleServe)
    return deployment.bind(args)
