"""The local Ray that `isle run` starts for itself: `python -m isleserve.raylocal --temp-dir DIR`.

It holds a Ray head that only this machine can reach and only holders of its token can use:

- every Ray port on 127.0.0.1 (the node's address is the loopback one, so GCS, raylet, object
  manager, workers and agents bind there);
- token authentication on (`RAY_AUTH_MODE=token`, the token read from `RAY_AUTH_TOKEN_PATH`,
  a file `isle run` writes with mode 0600 next to the controller's state);
- a private temporary directory (never `/tmp/ray`, whose `ray_current_cluster` file is how a
  plain `ray.init()` joins somebody else's cluster);
- no dashboard, hence no job API, unless `--dashboard` asks for it (then on 127.0.0.1 only, and
  behind the same token).

It prints `ray head: <gcs address>` once the head is up, then waits; SIGTERM or SIGINT shuts the
head down (`ray.shutdown()` ends every process it started) and it exits 0. Started by
`isleserve.run`, which connects `serve run --address` to the printed address.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

READY_PREFIX = "ray head: "
LOOPBACK = "127.0.0.1"
TOKEN_FILE = "ray_auth_token"
"""The token's file name in the state directory."""


def secure_env(env: dict[str, str], token_path: str) -> dict[str, str]:
    """`env` for a process that must start or join the local head: token authentication on with
    this token, a loopback node, no usage reports, and no inherited cluster address (which would
    join a Ray we did not start)."""
    out = {k: v for k, v in env.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
    out.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=token_path, RAY_USAGE_STATS_ENABLED="0",
               RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m isleserve.raylocal", description=__doc__.split("\n\n")[0])
    parser.add_argument("--temp-dir", required=True, help="Ray's temporary directory (private to this run)")
    parser.add_argument("--dashboard", action="store_true",
                        help="also start Ray's dashboard and its job API (on 127.0.0.1, token required)")
    args = parser.parse_args(argv)
    if os.environ.get("RAY_AUTH_MODE", "").lower() != "token" or not os.environ.get("RAY_AUTH_TOKEN_PATH"):
        print("isleserve.raylocal: RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH must be set", file=sys.stderr)
        return 2
    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _stop)
    import ray

    # address="local": always a new head. With no address, ray.init() looks for a running cluster
    # first (RAY_ADDRESS, then `ray_current_cluster` in the temp dir) and would join it
    ray.init(address="local", _node_ip_address=LOOPBACK, _temp_dir=args.temp_dir, include_dashboard=args.dashboard,
             dashboard_host=LOOPBACK, log_to_driver=False, configure_logging=False)
    print(f"{READY_PREFIX}{ray.get_runtime_context().gcs_address}", flush=True)
    while not stop.wait(1.0):
        pass
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
