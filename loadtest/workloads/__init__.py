"""Where a load test's requests come from: trace readers (`traces`), seeded generators
(`synthetic`), the transforms every workload goes through (`transforms`: rate scaling, time
compression, truncation, an SLO-class mix) and the prompt text a request is sent as (`prompts`).
`loadtest.workload.load_workload` is the one entry point.

    WorkloadError (ValueError)   input that is not a workload we can read; the message names
                                 the file and line, or the spec key, and what is wrong

Imports `loadtest.model` and `wire.text` only.
"""

from __future__ import annotations


class WorkloadError(ValueError):
    """One line a person can act on: `FILE:LINE: what is wrong` or `workload spec: key: ...`."""

    def __init__(self, message: str, source: str | None = None, line: int | None = None) -> None:
        self.source, self.line = source, line
        where = f"{source}:{line}" if source and line else source
        super().__init__(f"{where}: {message}" if where else message)
