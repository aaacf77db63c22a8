"""One writer per run directory: `run_dir/.lock`, held with flock for as long as the process writes the run,
holding the writer's pid and host.

The kernel releases the lock when its holder dies, however it dies (SIGKILL, OOM, a node reboot), so a lock is
never stale in the sense of blocking: a file still naming a pid while nobody holds the lock is what a dead writer
left behind, and the next writer takes over with a warning. flock rather than POSIX lockf: a lockf lock is lost
when the process closes any descriptor of the file (reading .lock to report it would drop it); Linux NFS clients
map flock onto NFS locks, so cluster run directories are covered too.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
from pathlib import Path

from harness.config import SetupError

LOCK_NAME = ".lock"


class RunDirBusy(SetupError):
    """Another live process writes this run directory."""


def holder(run_dir: Path) -> str | None:
    """'pid N on HOST' of the process that holds `run_dir`'s lock now, or None if nobody does. Takes nothing:
    run.py asks before Hydra writes its .hydra/ files into a directory that may belong to a live run."""
    content = locked_by(Path(run_dir) / LOCK_NAME)
    return None if content is None else _describe(content)


def locked_by(path: Path) -> str | None:
    """The first bytes of `path` if a live process holds an flock on it now (its holder's note, if it wrote one),
    None if nobody does or there is no such file. Takes nothing."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return _read(fd)
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


class RunDirLock:
    """`with RunDirLock(run_dir):` the body runs as the directory's only writer, or RunDirBusy names the holder."""

    def __init__(self, run_dir: Path | str) -> None:
        self.path = Path(run_dir) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            who = _describe(_read(fd))
            os.close(fd)
            raise RunDirBusy(
                f"hydra.run.dir: {self.path.parent} is being written by another process ({who}); wait for it to "
                "end, or choose another directory"
            ) from None
        left = _read(fd)
        if left and left.split()[0] != str(os.getpid()):
            print(
                f"warning: {self.path.parent}: taking over the lock left by {_describe(left)}, which has ended",
                file=sys.stderr,
            )
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Empty the file (a clean end leaves no pid to take over from), then unlock. The file stays: deleting it
        would let a process that opened it a moment earlier lock an orphan while a third locks a new file."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)
        except OSError:  # a full or read-only disk must not turn a finished run into a failed one
            pass
        finally:
            os.close(fd)  # closing drops the lock

    def __enter__(self) -> RunDirLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read(fd: int) -> str:
    try:
        return os.pread(fd, 256, 0).decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _describe(content: str) -> str:
    pid, _, host = content.partition(" ")
    if not pid:
        return "pid unknown"
    return f"pid {pid} on {host}" if host else f"pid {pid}"
