"""`isle run [CONFIG]` (what `make run` does): Ray Serve's own `serve run CONFIG` (default
configs/local.yaml, the simulated cluster) as a child, its output passed on (to stderr; once
stopping, without the line Ray prints on every clean Serve shutdown), and around it what a user
needs: which request path this tree runs (`isleserve: request path: compiled`), one line when
the endpoint answers

    isleserve: OpenAI API on http://127.0.0.1:8000/v1, 4 replicas ready

and a clean stop on Ctrl-C or SIGTERM (a service manager, `kill`, make): the signal goes to
`serve run` as the Ctrl-C it shuts Serve down on, then to the Ray head we started; the exit
status is 0 and nothing prints a stack trace. If `serve run` ends by itself (a bad config, a port
taken), its status is returned.

Ray is our own (`isleserve.raylocal`): a head started for this run alone, every port on 127.0.0.1,
token authentication on with a token generated for the run (`<state_dir>/ray_auth_token`, mode
0600), its temporary directory inside a private 0700 one (Ray makes its own 0777), no dashboard or
job API unless `--dashboard`. It never
joins a Ray it did not start; `--ray-address ADDR` deploys onto an existing cluster instead (its
token comes from the environment, as Ray's own tools read it)."""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

from control.state.files import DiskFiles, private_dir
from isleserve.raylocal import READY_PREFIX, TOKEN_FILE, secure_env
from isleserve.settings import app_args_from_serve_config
from topology.errors import ParseError
from wire import client, native
from wire.lifecycle import follow_parent
from wire.processes import ChildError, Group, Output, ReadyLine, ReadyProbe, Stop
from wire.supervisor import Child

READY_TIMEOUT_S = 600.0
RAY_READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0
RAY_STOP_TIMEOUT_S = 20.0
POLL_S = 0.5
RAY_DIR = "ray"
"""Ray's temp dir inside the run's private one."""


def ready_line(host: str, port: int, replicas: int) -> str:
    return f"isleserve: OpenAI API on http://{host}:{port}/v1, {replicas} replicas ready"


def _health(host: str, port: int) -> int | None:
    """The replicas the router serves when it answers /health, else None."""
    try:  # remote_ok: the address the config told the router to listen on, this machine's own
        doc = client.get_json(f"{client.origin(host, port)}/health", timeout_s=2, remote_ok=True)
        return int(doc.get("replicas", 0)) if isinstance(doc, dict) else None
    except (OSError, ValueError):
        return None


def _beside(name: str) -> str:
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else name


def write_token(state_dir: str) -> Path:
    """A new random token for this run's Ray in the private state directory (checked, or created
    0700: StateDirError when another user owns it or others may write to it), mode 0600, written
    through a fresh file (never through a link someone planted) and renamed."""
    files = DiskFiles(private_dir(state_dir))
    files.replace(TOKEN_FILE, secrets.token_hex(32).encode())
    return files.directory / TOKEN_FILE


def _ray_head(temp_dir: str, env: dict[str, str], dashboard: bool) -> Child:
    argv = [sys.executable, "-m", "isleserve.raylocal", "--temp-dir", temp_dir, *(["--dashboard"] if dashboard else [])]
    return Child(argv, name="ray head", ready=ReadyLine(READY_PREFIX), env=env, group=Group.OWN,
                 stderr=Output.STDOUT, parent_death=signal.SIGTERM,
                 stop=Stop(signal=signal.SIGTERM, grace_s=RAY_STOP_TIMEOUT_S, linger_s=2.0))


BENIGN_ON_STOP = ("Task ServeController.graceful_shutdown failed",)
"""What Ray prints on every clean `serve shutdown` (Serve kills its controller with `ray.kill` while
its own graceful_shutdown call is pending, and the raylet reports the task as failed): not passed
through once we are stopping."""


def _passer(stopping: threading.Event) -> Callable[[str], None]:
    def passed(line: str) -> None:
        if stopping.is_set() and any(b in line for b in BENIGN_ON_STOP):
            return
        print(line.rstrip("\n"), file=sys.stderr, flush=True)

    return passed


def _serve_run(config: str, address: str, env: dict[str, str], answers: Callable[[], bool],
               stopping: threading.Event) -> Child:
    return Child([_beside("serve"), "run", "--address", address, config], name="serve run",
                 ready=ReadyProbe(answers), env=env,
                 group=Group.OWN,  # Ctrl-C: ours alone
                 stdout=Output.CAPTURE, stderr=Output.STDOUT, on_line=_passer(stopping),  # its output passed on
                 parent_death=signal.SIGINT,  # we are killed outright: it still shuts Serve down
                 stop=Stop(signal=signal.SIGINT, grace_s=STOP_TIMEOUT_S, linger_s=None))


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="isle run", description=__doc__.split("\n\n")[0])
    parser.add_argument("config", nargs="?", default="configs/local.yaml", help="a Ray Serve config file")
    parser.add_argument("--ray-address", default=None,
                        help="deploy onto this existing Ray cluster (its token from RAY_AUTH_TOKEN_PATH or "
                             "~/.ray/auth_token) instead of starting a private local one")
    parser.add_argument("--dashboard", action="store_true",
                        help="the local Ray also runs its dashboard and job API (127.0.0.1, token required), "
                             "for `serve status` and `ray job`")
    parser.add_argument("--stop-with-parent", action="store_true",
                        help="stop cleanly when the process that started this one ends (`make run` asks for it: "
                             "GNU make, stopped by SIGTERM, exits without passing the signal on)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _arguments(argv)
    try:
        app = app_args_from_serve_config(args.config)
    except ParseError as err:
        print(f"isle run: {err}", file=sys.stderr)
        return 2
    router = app.router
    host = "127.0.0.1" if router.host in ("0.0.0.0", "::", "") else router.host
    # the replicas import the same tree with the same environment: they run what this process would
    print(f"isleserve: request path: {native.explain()}", file=sys.stderr, flush=True)
    stopping = threading.Event()
    serving: list[Child] = []

    def stop(signum: int, frame: FrameType | None) -> None:
        if not stopping.is_set():
            stopping.set()
            print("isleserve: stopping", file=sys.stderr, flush=True)
            for child in serving:
                child.terminate()  # SIGINT: serve run's own clean shutdown

    # before any child starts: a signal ignored here (a background job's SIGINT) would stay ignored
    # in the children, and `serve run` would never hear its Ctrl-C; handled ones start as default
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    if args.stop_with_parent:
        parent = os.getppid()
        if follow_parent(signal.SIGTERM) and os.getppid() != parent:  # it ended before we asked
            stop(signal.SIGTERM, None)
    head: Child | None = None
    temp_dir: str | None = None
    try:
        if args.ray_address is None:
            try:
                token = write_token(app.state_dir)
            except (OSError, ValueError) as err:  # StateDirError: a state dir that is not private
                print(f"isle run: state directory {app.state_dir}: {err}", file=sys.stderr)
                return 2
            env = secure_env(dict(os.environ), str(token))
            temp_dir = tempfile.mkdtemp(prefix="isle-ray-")  # 0700, a name nobody could take first
            # Ray makes its own temp dir and everything in it world-writable (0777): inside our 0700
            # directory nobody else can reach them (its logs, sockets, what its log monitor prints)
            head = _ray_head(os.path.join(temp_dir, RAY_DIR), env, args.dashboard).start()
            try:
                address = head.wait_ready(RAY_READY_TIMEOUT_S, cancel=stopping).split(READY_PREFIX, 1)[1].strip()
            except ChildError as err:
                if stopping.is_set():
                    return 0
                print(f"isle run: the local Ray did not start: {err}", file=sys.stderr)
                return 1
        else:
            env, address = dict(os.environ), args.ray_address
        if stopping.is_set():
            return 0
        return _serve(args.config, address, env, host, router.port, stopping, serving)
    finally:
        if head is not None:
            head.stop()  # SIGTERM: ray.shutdown() ends every process of the head
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)


def _serve(config: str, address: str, env: dict[str, str], host: str, port: int, stopping: threading.Event,
           serving: list[Child]) -> int:
    """`serve run` until it ends or we are stopped (`stop` above signals what is in `serving`)."""
    replicas: list[int] = []

    def answers() -> bool:
        found = _health(host, port)
        if found is not None:
            replicas.append(found)
        return found is not None

    # its lines come through a pipe now: unbuffered, so that they arrive as they are written
    child = _serve_run(config, address, {**env, "PYTHONUNBUFFERED": "1"}, answers, stopping).start()
    serving.append(child)
    if stopping.is_set():  # a signal between the start and the line above
        child.terminate()
    with contextlib.suppress(ChildError):  # it exited, we were stopped, or it is slow: no line then
        child.wait_ready(READY_TIMEOUT_S, poll_s=POLL_S, cancel=stopping, stop_on_failure=False)
        print(ready_line(host, port, replicas[-1]), flush=True)
    while child.poll() is None and not stopping.is_set():
        stopping.wait(POLL_S)
    if stopping.is_set():
        child.stop()  # SIGKILL to its group after STOP_TIMEOUT_S
        return 0
    return child.returncode or 0
