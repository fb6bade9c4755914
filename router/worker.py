"""`python -m router.worker DIR INDEX`: one more worker of a router whose leader started it (see
router.workers). It reads the leader's config and view from DIR, serves the same port, and stops
on SIGTERM or when its leader is gone."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from router.config import RouterConfig
from router.server import Router
from router.workers import (
    CONFIG_FILE,
    LEADER_GONE_SIGNAL,
    VIEW_FILE,
    leader_alive,
    leader_gone,
    read_silence,
    read_view,
)
from wire.lifecycle import serve_until_signalled


def _stop_unless_cancelled(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        os.kill(os.getpid(), signal.SIGTERM)  # the leader is gone: stop as if told to


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or not args[1].isdigit():
        print("usage: python -m router.worker DIR INDEX (started by the router itself)", file=sys.stderr)
        return 2
    directory, index = Path(args[0]), int(args[1])
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s %(name)s[{index}] %(levelname)s %(message)s")
    config = RouterConfig.model_validate_json((directory / CONFIG_FILE).read_text())
    view = (directory / VIEW_FILE).read_bytes()
    table, topology, plan = read_view(view)
    router = Router(config, table, topology, plan, worker=index)
    router.silence = read_silence(view)
    parent = os.getppid()
    watch: list[asyncio.Task[None]] = []
    orphaned: list[bool] = []

    async def start() -> None:
        await router.start()
        await router.join(directory)
        task = asyncio.get_running_loop().create_task(leader_gone(parent))
        task.add_done_callback(_stop_unless_cancelled)
        watch.append(task)

        def leader_died() -> None:
            orphaned.append(True)
            os.kill(os.getpid(), signal.SIGTERM)

        asyncio.get_running_loop().add_signal_handler(LEADER_GONE_SIGNAL, leader_died)

    async def stop() -> None:
        for task in watch:
            task.cancel()
        await router.stop()
        if orphaned or not leader_alive(parent):  # the leader died without cleaning up: we do
            shutil.rmtree(directory, ignore_errors=True)

    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve_until_signalled(start, stop, lambda: f"router worker {index} ready"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
