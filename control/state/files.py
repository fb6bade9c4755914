"""The controller's files under its state directory (`state.json`, `events.jsonl`, bench records
under `bench/`), behind one small seam so that a test can make the disk full.

The directory is private: created 0700, and refused (`StateDirError`, naming the path and what
is wrong) when another user owns it, when it is group- or world-writable, or when it is a
symbolic link that another user planted. Nobody else can then put a file or a link in it; the
writes do not follow links anyway (defence in depth): a whole-file write goes to `<name>.tmp`
made with `O_CREAT | O_EXCL | O_NOFOLLOW`, mode 0600, then renamed over `<name>` (a rename
replaces a link, it never writes through one); an append opens with `O_APPEND | O_NOFOLLOW`,
mode 0600. A link found in either place is an `OSError` (ELOOP or EEXIST), like a full disk:
the caller fails soft (control.state.persist).

The default directory is per user, never a shared `/tmp` path that another local user could
create first: `$XDG_STATE_HOME/isleserve`, else `~/.local/state/isleserve` (XDG's place for
"state that can be reused on restart"). Not `$XDG_RUNTIME_DIR`: systemd removes it when the
user's last session ends and at reboot, and with it what a restarted controller resumes from and
the bench baselines.

A directory removed while the controller runs is made again by the next write.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

APP_DIR = "isleserve"
DIR_MODE = 0o700
FILE_MODE = 0o600
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class StateDirError(ValueError):
    """The state directory is not safe to use (whose it is, or who may write to it)."""


class StateFiles(Protocol):
    """Files by name relative to the state directory (`bench/x.json` is allowed, `..` is not)."""

    @property
    def directory(self) -> Path: ...

    def read(self, name: str) -> bytes | None:
        """The file's bytes; None when it does not exist or cannot be read."""
        ...

    def replace(self, name: str, data: bytes) -> None:
        """The whole file, atomically (a crash leaves the old one or the new one). OSError on failure."""
        ...

    def append(self, name: str, data: bytes) -> None:
        """Bytes at the end of the file (created 0600 when missing). OSError on failure."""
        ...

    def remove(self, name: str) -> None: ...


def default_state_dir(env: Mapping[str, str] | None = None, home: str | None = None) -> str:
    """Where the controller keeps its state unless told (see the module's docstring)."""
    env = os.environ if env is None else env
    state_home = env.get("XDG_STATE_HOME", "")
    if state_home and os.path.isabs(state_home):
        return str(Path(state_home) / APP_DIR)
    return str(Path(home or os.path.expanduser("~")) / ".local" / "state" / APP_DIR)


def _unsafe_ancestor(path: Path, me: int) -> str | None:
    """Why another user could swap `path` (an ancestor of the state dir) or what is under it: a
    link or directory of theirs, or a directory others may write to without the sticky bit (with
    it, as /tmp, others cannot rename or remove what is ours). None: it is safe."""
    st = os.lstat(path)
    if st.st_uid not in (me, 0):
        kind = "symbolic link" if stat.S_ISLNK(st.st_mode) else "directory"
        return f"{str(path)!r} is a {kind} owned by uid {st.st_uid}"
    if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return f"{str(path)!r} is writable by others without the sticky bit (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def check_ancestors(path: Path) -> None:
    """StateDirError when a directory above the state dir, on the path as given or as resolved,
    would let another user move it aside and put their own in its place."""
    me = os.geteuid()
    for chain in (path.absolute().parents, path.resolve().parents):
        for ancestor in chain:
            why = _unsafe_ancestor(ancestor, me)
            if why is not None:
                raise StateDirError(f"state_dir {str(path)!r} is under {why}: another user could replace it; "
                                    "choose a state_dir under directories only you (or root) can change")


def check_private(path: Path) -> None:
    """StateDirError unless `path` is a directory of ours that no one else may write to (a link
    to one is accepted only when the link is ours too), under directories no one else may change."""
    me = os.geteuid()
    check_ancestors(path)
    link = os.lstat(path)
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (me, 0):
        raise StateDirError(f"state_dir {str(path)!r} is a symbolic link owned by uid {link.st_uid}, not by this "
                            f"user (uid {me}): refusing it; remove it or choose another state_dir")
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise StateDirError(f"state_dir {str(path)!r} is not a directory")
    if st.st_uid != me:
        raise StateDirError(f"state_dir {str(path)!r} is owned by uid {st.st_uid}, not by this user (uid {me}): "
                            "another user may have created it first; remove it or choose another state_dir")
    if st.st_mode & 0o022:
        raise StateDirError(f"state_dir {str(path)!r} is writable by its group or by everyone (mode "
                            f"{stat.S_IMODE(st.st_mode):04o}): refusing it; `chmod 700` it or choose another "
                            "state_dir")


def private_dir(path: str | Path) -> Path:
    """The directory, created 0700 (its missing parents too) when it does not exist, then checked
    (`check_private`). OSError when it cannot be created (a full disk)."""
    p = Path(path).expanduser()
    if not p.is_absolute():
        p = Path.cwd() / p
    if not os.path.lexists(p):
        for parent in reversed([*p.parents]):
            if not os.path.lexists(parent):
                with contextlib.suppress(FileExistsError):
                    os.mkdir(parent, DIR_MODE)
        try:
            os.mkdir(p, DIR_MODE)
        except FileExistsError:
            pass
        else:
            os.chmod(p, DIR_MODE)  # whatever the umask took away or left
    check_private(p)
    return p


class DiskFiles:
    """The real files. The directory is checked when made (a `StateDirError` is raised at once);
    one that cannot be created yet (a full disk) is created by the first write that can."""

    def __init__(self, directory: str | Path) -> None:
        self._path = Path(directory).expanduser()
        self._ready = False
        self._ensure(raise_os=False)

    @property
    def directory(self) -> Path:
        return self._path

    def _ensure(self, raise_os: bool = True) -> None:
        if self._ready:
            return
        try:
            self._path = private_dir(self._path)
        except StateDirError:
            raise
        except OSError:
            if raise_os:
                raise
            return
        self._ready = True

    def _at(self, name: str) -> Path:
        parts = Path(name).parts
        if not parts or Path(name).is_absolute() or ".." in parts:
            raise ValueError(f"{name!r}: a name inside the state directory")
        return self._path / name

    def read(self, name: str) -> bytes | None:
        try:
            fd = os.open(self._at(name), os.O_RDONLY | _NOFOLLOW | _CLOEXEC)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as f:
            try:
                return f.read()
            except OSError:
                return None

    def _again(self, write: Callable[[], None]) -> None:
        """`write`, once more after making the directory again if it went (FileNotFoundError)."""
        self._ensure()
        try:
            write()
        except FileNotFoundError:
            self._ready = False
            self._ensure()
            write()

    def replace(self, name: str, data: bytes) -> None:
        self._again(lambda: self._replace(name, data))

    def _replace(self, name: str, data: bytes) -> None:
        path = self._at(name)
        if len(Path(name).parts) > 1:
            path.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
        try:
            fd = os.open(tmp, flags, FILE_MODE)
        except FileExistsError:  # a crash's leftover, or something planted: the name goes, not its target
            os.unlink(tmp)
            fd = os.open(tmp, flags, FILE_MODE)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def append(self, name: str, data: bytes) -> None:
        self._again(lambda: self._append(name, data))

    def _append(self, name: str, data: bytes) -> None:
        fd = os.open(self._at(name), os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW | _CLOEXEC, FILE_MODE)
        try:
            size = os.fstat(fd).st_size
            view = memoryview(data)
            try:
                while view:
                    written = os.write(fd, view)
                    if written <= 0:
                        raise OSError(errno.EIO, "short write")
                    view = view[written:]
            except OSError:  # no half line left behind for the readers (one JSON object a line)
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, size)
                raise
        finally:
            os.close(fd)

    def remove(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._at(name))
