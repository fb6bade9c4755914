"""The topology layer's errors.

    TopologyError            every problem this package reports; one clear line of text
    ├── ParseError           input that is not a topology we can read (exit code 2)
    └── DiscoveryError       live discovery failed (no driver, no permission, GPU lost)
"""

from __future__ import annotations


class TopologyError(Exception):
    """Base class: `str(err)` is one line a person can act on."""


class ParseError(TopologyError):
    def __init__(self, message: str, source: str | None = None) -> None:
        self.source = source
        super().__init__(f"{source}: {message}" if source else message)


class DiscoveryError(TopologyError):
    pass
