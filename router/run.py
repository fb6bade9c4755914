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
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from router.appconfig import app_args_from_serve_config
from topology.errors import ParseError

READY_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 60.0
POLL_S = 0.5


def ready_line(host: str, port: int, replicas: int) -> str:
    return f"isleserve: OpenAI API on http://{host}:{port}/v1, {replicas} replicas ready"


def _health(host: str, port: int) -> int | None:
    """The replicas the router serves when it answers /health, else None."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=2) as resp:
            return int(json.loads(resp.read()).get("replicas", 0))
    except (OSError, ValueError, urllib.error.URLError):
        return None


def _serve_binary() -> str:
    beside = Path(sys.executable).parent / "serve"
    return str(beside) if beside.exists() else "serve"


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
    child = subprocess.Popen([_serve_binary(), "run", args.config], env=env, process_group=0)  # Ctrl-C: ours alone
    stopping = threading.Event()

    def stop(signum: int, frame: FrameType | None) -> None:
        if not stopping.is_set():
            stopping.set()
            print("isleserve: stopping", file=sys.stderr, flush=True)
            child.send_signal(signal.SIGINT)  # serve run's own clean shutdown

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    deadline, said = time.monotonic() + READY_TIMEOUT_S, False
    while child.poll() is None and not stopping.is_set():
        if not said and time.monotonic() < deadline:
            replicas = _health(host, router.port)
            if replicas is not None:
                print(ready_line(host, router.port, replicas), flush=True)
                said = True
        stopping.wait(POLL_S)
    if stopping.is_set():
        try:
            child.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        return 0
    return child.returncode or 0
