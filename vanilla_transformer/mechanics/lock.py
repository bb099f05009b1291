"""One process at a time in a folder: a lock file that says who holds it, and is taken over once that process is gone.

`FolderLock(folder).take()` creates `<folder>/.vanilla_transformer.lock` atomically (`os.open` with O_CREAT|O_EXCL, so
of two processes racing for it exactly one creates it) and writes into it the holder: host name, pid, the process's
start time (field 22 of /proc/<pid>/stat, clock ticks since boot), the host's boot id and pid namespace, and a token.
`release()` deletes the file if it is still the one it wrote.

A lock left by a process that was killed (SIGKILL, a power cut) stays behind; the next `take()` tells a stale lock from
a live one:

- on the same host (same host name, boot id and pid namespace), the lock is stale when no process has that pid, or
  the process with that pid started at another time (the pid was reused); after a reboot (another boot id) every
  lock of the host is stale. A stale lock is replaced, and `take()` returns a note that says so;
- from another host (or another container: another pid namespace), the process cannot be checked: refused, naming
  the host and pid and the file to delete if that run is known to be dead.

Taking over a stale lock (read it, judge it, delete it, create ours) runs under an `flock` of the folder itself, which
the kernel releases when its process ends, so two processes cannot both take over the same stale lock. Where the
filesystem refuses `flock` (some network filesystems), the O_EXCL create still lets only one of them win.
"""

import json
import os
import socket
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

from vanilla_transformer.mechanics.errors import VanillaTransformerError

try:
    import fcntl
except ImportError:  # Windows: no flock; the O_EXCL create still decides between racing processes
    fcntl = None

LOCK_NAME = ".vanilla_transformer.lock"
FRESH_SECONDS = 30  # a lock file younger than this that cannot be read yet is being written by its taker


class FolderLockError(VanillaTransformerError):
    """The folder is held by another process, or its lock file cannot be judged; the message says what to do."""


def process_start(pid: int) -> int | None:
    """When process `pid` started (clock ticks after boot, /proc/<pid>/stat field 22); None where there is no
    such process or no /proc (then only the pid is compared)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # after the command name, which may hold spaces and ")"


def _read_first_line(path: str) -> str | None:
    try:
        return Path(path).read_text().strip() or None
    except OSError:
        return None


def this_host() -> dict:
    """What tells this host (and this boot, and this pid namespace) apart from others."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = None
    return {
        "host": socket.gethostname(),
        "boot_id": _read_first_line("/proc/sys/kernel/random/boot_id"),
        "pid_namespace": namespace,
    }


def holder_record(pid: int) -> dict:
    """What a lock taken by process `pid` of this host records (also how a test writes the lock of another
    process)."""
    return {
        **this_host(),
        "pid": pid,
        "process_start": process_start(pid),
        "taken_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        "token": uuid.uuid4().hex,
    }


def pid_exists(pid: int) -> bool:
    """Whether process `pid` runs on this machine (under any user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    except OSError:
        return False
    return True


def holder_state(holder: dict) -> tuple[str, str]:
    """("live" | "gone" | "unknown", why): whether the process that holds a lock still runs."""
    here = this_host()
    if holder.get("host") != here["host"]:
        return "unknown", f"it runs on host {holder.get('host')!r}, not this one ({here['host']!r})"
    if holder.get("boot_id") and here["boot_id"] and holder["boot_id"] != here["boot_id"]:
        return "gone", "this host has restarted since"
    if holder.get("pid_namespace") != here["pid_namespace"]:
        return "unknown", "it runs in another container (pid namespace) of this host"
    pid, started = holder["pid"], holder.get("process_start")
    if started is not None and here["boot_id"] is not None:  # /proc: the start time tells a reused pid apart
        now = process_start(pid)
        if now is None:
            return "gone", f"no process {pid} runs"
        if now != started:
            return "gone", f"process {pid} is another program now (started at another time)"
        return "live", f"process {pid} runs"
    if pid_exists(pid):
        return "live", f"process {pid} runs"
    return "gone", f"no process {pid} runs"


@contextmanager
def _folder_flock(folder: Path):
    """Hold an exclusive flock on `folder` (released by the kernel if this process dies); best effort."""
    if fcntl is None:
        yield
        return
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        except OSError:
            pass  # a filesystem without flock: the O_EXCL create alone decides
        yield
    finally:
        os.close(descriptor)  # releases the flock


class FolderLock:
    """The lock of `folder`, for one run (`what` names it in messages)."""

    def __init__(self, folder: str | Path, what: str = "run"):
        self.folder, self.what = Path(folder), what
        self.path = self.folder / LOCK_NAME
        self.token: str | None = None

    def read_holder(self) -> dict | None:
        """The lock's record, None when there is no lock; a FolderLockError when it is not a lock we wrote (a
        symbolic link, unreadable, damaged) or is being written right now."""
        try:
            descriptor = os.open(self.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            return None
        except OSError as error:
            if self.path.is_symlink():
                raise FolderLockError(
                    f"{self.path} is a symbolic link, not a lock this project wrote: remove the link (it is never "
                    "followed) and start again"
                ) from error
            raise FolderLockError(f"cannot read the lock file {self.path} ({error})") from error
        with os.fdopen(descriptor, "rb") as file:
            text = file.read()
            age = time.time() - os.fstat(file.fileno()).st_mtime
        try:
            holder = json.loads(text)
            if not (isinstance(holder, dict) and isinstance(holder.get("pid"), int) and "host" in holder):
                raise ValueError("not a lock record")
        except (ValueError, UnicodeDecodeError) as error:
            if age < FRESH_SECONDS:
                raise FolderLockError(
                    f"another {self.what} is taking the lock of {self.folder} right now ({self.path}): use another "
                    "folder, or wait for it to end"
                ) from error
            raise FolderLockError(
                f"{self.path} is not a lock this project wrote (damaged: {error}): if no {self.what} uses "
                f"{self.folder}, delete {self.path} and start again"
            ) from error
        return holder

    def take(self) -> str | None:
        """Take the lock, or raise FolderLockError naming its holder; returns a note when a stale lock (of a process
        that has ended) was taken over, else None."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise FolderLockError(f"cannot create {self.folder} ({error})") from error
        with _folder_flock(self.folder):
            note = None
            if (holder := self.read_holder()) is not None:
                state, why = holder_state(holder)
                who = f"pid {holder['pid']} on host {holder.get('host')!r}, taken {holder.get('taken_at', '?')}"
                if state == "live":
                    raise FolderLockError(
                        f"{self.folder} is in use by another {self.what} ({who}; {why}): wait for it to end, or "
                        f"choose another folder. Its lock file is {self.path}"
                    )
                if state == "unknown":
                    raise FolderLockError(
                        f"{self.folder} is locked by a {self.what} ({who}) that cannot be checked from here: {why}. "
                        f"If that {self.what} has ended, delete {self.path} and start again"
                    )
                self.path.unlink()
                note = f"took over the lock of {self.folder} left by a {self.what} that has ended ({who}; {why})"
            record = holder_record(os.getpid())
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
            try:
                descriptor = os.open(self.path, flags, 0o644)
            except FileExistsError as error:  # another process created it between our look and our create
                raise FolderLockError(
                    f"another {self.what} took the lock of {self.folder} at the same moment ({self.path}): use "
                    "another folder, or wait for it to end"
                ) from error
            except OSError as error:
                raise FolderLockError(f"cannot create the lock file {self.path} ({error})") from error
            with os.fdopen(descriptor, "w") as file:
                file.write(json.dumps(record, indent=1) + "\n")
                file.flush()
                os.fsync(file.fileno())
            self.token = record["token"]
        return note

    def release(self) -> None:
        """Delete the lock file if this object took it and it is still ours; idempotent."""
        if self.token is None:
            return
        try:
            holder = self.read_holder()
        except FolderLockError:
            holder = None
        if holder is not None and holder.get("token") == self.token:
            self.path.unlink(missing_ok=True)
        self.token = None
