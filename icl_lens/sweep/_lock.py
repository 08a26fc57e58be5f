"""One sweep at a time per output folder: ``DIR/sweep.lock``.

The main process of a sweep holds an exclusive ``flock`` on ``DIR/sweep.lock`` for the
whole run and writes its pid, host and start time into it; the file is removed at the
end. A second sweep into the same folder finds the lock held and stops with
:class:`SweepLockedError`. The kernel drops a ``flock`` when its process dies, so a lock
file left by a killed sweep (its pid no longer running) is stale: the next sweep takes
it over and says so. Where the file system has no ``flock`` (some network file systems),
the pid in the file decides: a lock whose pid is alive on this host is held.
"""
from __future__ import annotations

import errno
import json
import os
import socket
import time
import warnings
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

LOCK = "sweep.lock"


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


def _holder(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8") or "{}")
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


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

    def acquire(self) -> "FolderLock":
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        for _ in range(10):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            got = self._try_flock(fd)
            holder = _holder(self.path)
            if got is None:  # no flock here: the pid decides
                got = not (holder and holder.get("host") == me["host"] and holder.get("pid") != me["pid"]
                           and _pid_alive(int(holder.get("pid", 0))))
            if not got:
                os.close(fd)
                raise SweepLockedError(
                    f"{self.path.parent} is in use by another sweep ({_describe(holder)}); wait for it to finish, "
                    f"or sweep into another --out folder")
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
