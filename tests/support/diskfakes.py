"""A state directory whose disk a test can fill: the real files (control.state.files),
with every write failing ENOSPC while `full` is set (reads go on working, as on a full disk)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from control.state.files import DiskFiles


class FullDisk:
    def __init__(self, directory: str | Path) -> None:
        self.real = DiskFiles(directory)
        self.full = False
        self.refused: list[str] = []
        """Every write refused, by name."""

    @property
    def directory(self) -> Path:
        return self.real.directory

    def _check(self, name: str) -> None:
        if self.full:
            self.refused.append(name)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.directory / name))

    def read(self, name: str) -> bytes | None:
        return self.real.read(name)

    def replace(self, name: str, data: bytes) -> None:
        self._check(name)
        self.real.replace(name, data)

    def append(self, name: str, data: bytes) -> None:
        self._check(name)
        self.real.append(name, data)

    def remove(self, name: str) -> None:
        self.real.remove(name)
