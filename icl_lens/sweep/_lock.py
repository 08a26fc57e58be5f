"""One sweep at a time per output folder: ``DIR/sweep.lock``.

The main process of a sweep holds an exclusive ``flock`` on ``DIR/sweep.lock`` for the
whole run and writes its pid, host and start time into it; the file is removed at the
end. A second sweep into the same folder finds the lock held and stops with
:class:`SweepLockedError`. The kernel drops a ``flock`` when its process dies, so a lock
file left by a killed sweep (its pid no longer running) is stale: the next sweep takes
it over and says so. Where the file system has no ``flock`` (some network file systems),
the pid in the file decides: a lock whose pid is alive on this host is held.

The file is opened without following a symbolic link (``O_NOFOLLOW``; created with
``O_EXCL``), and must be a regular file: a ``sweep.lock`` that is a link is refused rather
than written through (it could point at any file of the user's). :func:`check_unlocked`
answers "is a live sweep writing here?" without taking the lock and without importing
torch, so the command line refuses a second sweep at once.
"""
from __future__ import annotations

import errno
import json
import os
import socket
import stat
import time
import warnings
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

LOCK = "sweep.lock"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class SweepLockedError(ValueError):
    """Another sweep is writing into the same output folder."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def _holder(fd: int) -> dict:
    """The pid, host and start time written in the open lock file (read through ``fd``, never by name)."""
    try:
        data = json.loads(os.pread(fd, 4096, 0).decode("utf-8") or "{}")
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _open_lock(path: Path) -> int:
    """The lock file's descriptor: created (``O_EXCL``) or opened, never through a symbolic link; a regular file."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
    except FileExistsError:
        try:
            fd = os.open(path, os.O_RDWR | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
        except OSError as err:
            if err.errno == errno.ELOOP or path.is_symlink():
                raise SweepLockedError(f"{path} is a symbolic link; a sweep never writes through one (it could "
                                       f"overwrite the file it points to): remove it and run again") from None
            raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise SweepLockedError(f"{path} is not a regular file; remove it and run again")
    return fd


def _describe(holder: dict) -> str:
    return (f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, started {holder.get('started', '?')}"
            if holder else "a process that left no details")


class FolderLock:
    """``with FolderLock(out):`` holds the folder's sweep lock (see the module doc)."""

    def __init__(self, folder: str | Path):
        self.path = Path(folder) / LOCK
        self._fd: int | None = None

    def _try_flock(self, fd: int) -> bool | None:
        """True: locked; False: held by another process; None: this file system has no flock."""
        if fcntl is None:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False
        except OSError as err:
            if err.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                return None
            raise

    def _take(self, fd: int) -> tuple[bool, dict]:
        """Lock ``fd`` if no live sweep holds it; where there is no flock, the pid in the file decides."""
        got, holder = self._try_flock(fd), _holder(fd)
        if got is None:
            pid = holder.get("pid")
            got = not (holder and holder.get("host") == socket.gethostname() and pid != os.getpid()
                       and _pid_alive(int(pid or 0)))
        return got, holder

    def _in_use(self, holder: dict) -> SweepLockedError:
        return SweepLockedError(f"{self.path.parent} is in use by another sweep ({_describe(holder)}); wait for it "
                                f"to finish, or sweep into another --out folder")

    def acquire(self) -> "FolderLock":
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        for _ in range(10):
            try:
                fd = _open_lock(self.path)
            except FileNotFoundError:  # removed between the two opens: try again
                continue
            got, holder = self._take(fd)
            if not got:
                os.close(fd)
                raise self._in_use(holder)
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # the holder removed the file between our open and our lock: try again
                os.close(fd)
                continue
            if holder:
                warnings.warn(f"icl_lens: took over the stale sweep lock of {self.path.parent} "
                              f"({_describe(holder)}; that process is no longer running)", stacklevel=2)
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps(me).encode())
            os.fsync(fd)
            self._fd = fd
            return self
        raise SweepLockedError(f"{self.path.parent}: could not take the sweep lock (it kept changing); try again")

    def probe(self) -> None:
        """Raise :class:`SweepLockedError` if a live sweep holds the lock (the lock is not taken; a missing folder
        or lock file is free)."""
        if not self.path.parent.is_dir() or not (self.path.exists() or self.path.is_symlink()):
            return
        fd = _open_lock(self.path)
        try:
            got, holder = self._take(fd)
            if not got:
                raise self._in_use(holder)
        finally:
            os.close(fd)  # drops the flock, if taken

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)  # still holding the lock, so no one else owns this file
        finally:
            os.close(self._fd)  # drops the flock
            self._fd = None

    def __enter__(self) -> "FolderLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def check_unlocked(folder: str | Path) -> None:
    """Raise :class:`SweepLockedError` if a live sweep is writing into ``folder`` (or its lock file is a link)."""
    FolderLock(folder).probe()
