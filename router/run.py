"""`isle run [CONFIG]` (what `make run` does): Ray Serve's own `serve run CONFIG` (default
configs/local.yaml, the simulated cluster on a local Ray) as a child, its output passed through,
and around it what a user needs: one line when the endpoint answers

    isleserve: OpenAI API on http://127.0.0.1:8000/v1, 4 replicas ready

and a clean stop on Ctrl-C or SIGTERM (a service manager, `kill`, make): the signal goes to
`serve run` as the Ctrl-C it shuts its local Ray down on, the exit status is 0 and nothing
prints a stack trace. If `serve run` ends by itself (a bad config, a port taken), its status is
returned."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

from pools.supervisor import Child, ChildError, Group, Output, ReadyProbe, Stop
from pools.wire import client
from router.appconfig import app_args_from_serve_config
from topology.errors import ParseError

READY_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 60.0
POLL_S = 0.5


def ready_line(host: str, port: int, replicas: int) -> str:
    return f"isleserve: OpenAI API on http://{host}:{port}/v1, {replicas} replicas ready"


def _health(host: str, port: int) -> int | None:
    """The replicas the router serves when it answers /health, else None."""
    try:  # remote_ok: the address the config told the router to listen on, this machine's own
        doc = client.get_json(f"{client.origin(host, port)}/health", timeout_s=2, remote_ok=True)
        return int(doc.get("replicas", 0)) if isinstance(doc, dict) else None
    except (OSError, ValueError):
        return None


def _serve_binary() -> str:
    beside = Path(sys.executable).parent / "serve"
    return str(beside) if beside.exists() else "serve"


def _serve_run(config: str, env: dict[str, str], answers: Callable[[], bool]) -> Child:
    return Child([_serve_binary(), "run", config], name="serve run", ready=ReadyProbe(answers), env=env,
                 group=Group.OWN,  # Ctrl-C: ours alone
                 stdout=Output.INHERIT, stderr=Output.INHERIT,  # its output passed through
                 parent_death=signal.SIGINT,  # we are killed outright: it still shuts its local Ray down
                 stop=Stop(signal=signal.SIGINT, grace_s=STOP_TIMEOUT_S, linger_s=None))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="isle run", description=__doc__.split("\n\n")[0])
    parser.add_argument("config", nargs="?", default="configs/local.yaml", help="a Ray Serve config file")
    args = parser.parse_args(argv)
    try:
        router = app_args_from_serve_config(args.config).router
    except ParseError as err:
        print(f"isle run: {err}", file=sys.stderr)
        return 2
    host = "127.0.0.1" if router.host in ("0.0.0.0", "::", "") else router.host
    env = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", **os.environ}
    replicas: list[int] = []

    def answers() -> bool:
        found = _health(host, router.port)
        if found is not None:
            replicas.append(found)
        return found is not None

    child = _serve_run(args.config, env, answers).start()
    stopping = threading.Event()

    def stop(signum: int, frame: FrameType | None) -> None:
        if not stopping.is_set():
            stopping.set()
            print("isleserve: stopping", file=sys.stderr, flush=True)
            child.terminate()  # SIGINT: serve run's own clean shutdown

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    with contextlib.suppress(ChildError):  # it exited, we were stopped, or it is slow: no line then
        child.wait_ready(READY_TIMEOUT_S, poll_s=POLL_S, cancel=stopping, stop_on_failure=False)
        print(ready_line(host, router.port, replicas[-1]), flush=True)
    while child.poll() is None and not stopping.is_set():
        stopping.wait(POLL_S)
    if stopping.is_set():
        child.stop()  # SIGKILL to its group after STOP_TIMEOUT_S
        return 0
    return child.returncode or 0
