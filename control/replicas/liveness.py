"""Is an engine whose process is alive still answering? A stopped (SIGSTOP) or deadlocked engine
keeps its process and its port: the kernel still accepts connections for it, so only a probe
with a deadline tells it from a live one.

The health loop asks every replica's `/health` each pass (2 s timeout). One that fails gets a
restart; the replica then probes again for up to `HUNG_AFTER_S` (`answers_within`): an engine
that answers once is left alone (a busy moment), one that never does is hung, killed (SIGKILL: a
stopped process acts on no other signal) and started again. With a pass every 2 s that is
detected within 2 + 2 + `HUNG_AFTER_S` = 8 s of the hang, and the kill ends its in-flight
requests at once: the router retries those that sent the client nothing yet on another replica
and ends the others cleanly (router.flight), instead of waiting for its 60 s idle timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable

HUNG_AFTER_S = 4.0
"""How long an engine whose process lives may go without answering `/health` (after the health
pass's own failed probe) before it is taken for hung and restarted."""
PROBE_TIMEOUT_S = 1.0
RETRY_PAUSE_S = 0.2
"""Between probes that failed at once (refused): no busy loop."""


def answers_within(probe: Callable[[float], bool], window_s: float = HUNG_AFTER_S, *,
                   clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                   probe_timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """True as soon as `probe(timeout_s)` answers; False when none did within `window_s`."""
    deadline = clock() + window_s
    while True:
        left = deadline - clock()
        if left <= 0:
            return False
        started = clock()
        if probe(min(probe_timeout_s, left)):
            return True
        if clock() - started < RETRY_PAUSE_S:
            sleep(min(RETRY_PAUSE_S, max(0.0, deadline - clock())))
