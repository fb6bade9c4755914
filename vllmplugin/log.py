"""The plugin's logger. vLLM loads general plugins while it builds its argument parser, before
it configures its own logging, so the plugin's lines have a handler of their own (standard
error, like vLLM's) and do not wait for vLLM's."""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger("vllm.isleserve")
if not logger.handlers:
    _handler = logging.StreamHandler(sys.stderr)
    _handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [isleserve vLLM plugin, pid %(process)d] "
                                            "%(message)s", "%m-%d %H:%M:%S"))
    logger.addHandler(_handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
