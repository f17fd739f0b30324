"""State-directory and disk failures, named: one line with the path and the condition.

A worker in a crash loop must say what is wrong with its state: before this module a read-only
directory gave "OSError: message withheld (it may quote an input value)" and a full disk
"worker failed: EngineProcessError". The OS error's class, errno name and SQLite's result code
are not personal data (they describe the file system, never a record), so they are named.

* :func:`check_state_dir` at start, before any client or engine (once without creating
  anything, then again once every start check has passed): the directory exists (or is
  created, when its parent exists: a first start), is a directory, can be written (a probe
  file is created, synced and removed), and the file system has room; the state files in it
  are writable. Each failure is a :class:`StateDirError`, exit 2.
* :func:`store_error` at run time: a SQLite or OS error of a store becomes a
  :class:`~state.errors.StateStoreError` naming the file and the condition; it crosses the
  engine process unchanged (privgw's own messages do) and ends the worker with one fatal line.
  Nothing is lost: the window's state transaction is rolled back, nothing of it was produced
  and its offsets stay uncommitted.
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import stat
from enum import StrEnum
from pathlib import Path

from state.errors import StateStoreError

log = logging.getLogger(__name__)

_PROBE = ".privgw-write-probe"
_FIX_DIR = "choose another --state-dir / PRIVGW_STATE_DIR"


class StateCondition(StrEnum):
    MISSING = "missing"
    NOT_A_DIRECTORY = "not a directory"
    READ_ONLY = "read-only file system"
    NOT_WRITABLE = "not writable"
    WRONG_OWNER = "wrong owner"
    DISK_FULL = "disk full"
    QUOTA = "disk quota exceeded"
    CORRUPT = "corrupt database"
    IO_ERROR = "I/O error"
    IN_USE = "in use"
    OTHER = "cannot be used"


class StateDirError(StateStoreError):
    """The state directory or a file in it cannot be used. One line: path and condition."""

    def __init__(self, message: str, condition: StateCondition) -> None:
        super().__init__(message)
        self.condition = condition


_ERRNO_CONDITION = {
    errno.EROFS: StateCondition.READ_ONLY,
    errno.ENOSPC: StateCondition.DISK_FULL,
    errno.EDQUOT: StateCondition.QUOTA,
    errno.EACCES: StateCondition.NOT_WRITABLE,
    errno.EPERM: StateCondition.NOT_WRITABLE,
    errno.ENOENT: StateCondition.MISSING,
    errno.ENOTDIR: StateCondition.NOT_A_DIRECTORY,
    errno.EIO: StateCondition.IO_ERROR,
}

_FIXES = {
    StateCondition.MISSING: f"create it, or {_FIX_DIR}",
    StateCondition.NOT_A_DIRECTORY: f"move that file away, or {_FIX_DIR}",
    StateCondition.READ_ONLY: f"mount it read-write, or {_FIX_DIR}",
    StateCondition.NOT_WRITABLE: "give the worker's user write access to it (chown/chmod)",
    StateCondition.WRONG_OWNER: "chown it to the worker's user",
    StateCondition.DISK_FULL: "free space on its file system (or grow it), then restart",
    StateCondition.QUOTA: "raise the quota or free space, then restart",
    StateCondition.CORRUPT: "restore the file from a backup (docs/operating.md), or move it "
    "away to start with new state",
    StateCondition.IO_ERROR: "check the disk (kernel log), then restore from a backup if needed",
    StateCondition.IN_USE: "stop the other worker that has it open",
    StateCondition.OTHER: _FIX_DIR,
}


def fix_for(condition: StateCondition) -> str:
    """What an operator does about ``condition``."""
    return _FIXES[condition]


def _errno_text(err: OSError) -> str:
    code = err.errno
    name = errno.errorcode.get(code, str(code)) if code is not None else "no errno"
    return f"{err.__class__.__name__} {name}"


def _owner_problem(path: Path) -> tuple[StateCondition, str] | None:
    """When ``path`` is not writable for lack of permission: whose it is, and its mode."""
    try:
        st = path.stat()
    except OSError:
        return None
    me = os.geteuid()
    mode = f"mode {stat.S_IMODE(st.st_mode):04o}"
    if st.st_uid != me:
        return (
            StateCondition.WRONG_OWNER,
            f"owned by uid {st.st_uid}, {mode}; this worker runs as uid {me} and cannot write it",
        )
    return StateCondition.NOT_WRITABLE, f"{mode}: its owner (uid {me}, this worker) cannot write it"


def os_error(err: OSError, path: Path, what: str = "state directory") -> StateDirError:
    """A one-line error for an OS error on ``path``."""
    condition = _ERRNO_CONDITION.get(err.errno or 0, StateCondition.OTHER)
    detail = condition.value
    if condition is StateCondition.NOT_WRITABLE:
        owner = _owner_problem(path if _exists(path) else path.parent)
        if owner is not None:
            condition, detail = owner[0], f"{owner[0].value}: {owner[1]}"
    if condition is StateCondition.DISK_FULL:
        detail += f" ({_free(path)})"
    return StateDirError(
        f"{what} {path}: {detail} ({_errno_text(err)}); {_FIXES[condition]}", condition
    )


def _exists(path: Path) -> bool:
    try:
        path.stat()
    except OSError:
        return False
    return True


def _free(path: Path) -> str:
    target = path if _exists(path) else path.parent
    try:
        st = os.statvfs(target)
    except OSError:
        return "free space unknown"
    return f"{st.f_bavail * st.f_frsize} bytes available"


def check_state_dir(path: Path, *, create: bool = True) -> None:
    """Raise :class:`StateDirError` unless ``path`` can hold the worker's state (see the
    module docstring). A missing directory whose parent exists is created (mode 0700); with
    ``create`` False it is not (its parent must be writable): the checks before any write."""
    path = Path(path)
    try:
        mode: int | None = path.stat().st_mode
    except FileNotFoundError:
        mode = None
    except OSError as err:  # a parent the worker may not enter, say
        raise os_error(err, path) from None
    if mode is not None and not stat.S_ISDIR(mode):
        raise StateDirError(
            f"state directory {path}: {StateCondition.NOT_A_DIRECTORY.value} (a file is there); "
            f"{_FIXES[StateCondition.NOT_A_DIRECTORY]}",
            StateCondition.NOT_A_DIRECTORY,
        )
    if mode is None:
        parent = path.parent
        if not parent.is_dir():
            raise StateDirError(
                f"state directory {path}: {StateCondition.MISSING.value}, and so is its parent "
                f"{parent} (the worker creates the last level only, so that a mistyped path or "
                f"an unmounted volume is not taken for a new state); {_FIX_DIR}, or create it",
                StateCondition.MISSING,
            )
        if not create:
            if not os.access(parent, os.W_OK | os.X_OK):
                code = errno.EROFS if _file_system_condition(path) else errno.EACCES
                raise os_error(OSError(code, os.strerror(code)), path)
            return
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            pass
        except OSError as err:
            raise os_error(err, path) from None
        log.warning(
            "state directory %s did not exist and was created, empty: a first start. If this "
            "worker had state before, stop it: the path is wrong or its volume is not mounted",
            path,
        )
    _probe_write(path)
    try:
        st = os.statvfs(path)
    except OSError as err:
        raise os_error(err, path) from None
    if st.f_bavail == 0:
        raise StateDirError(
            f"state directory {path}: {StateCondition.DISK_FULL.value} (0 bytes available); "
            f"{_FIXES[StateCondition.DISK_FULL]}",
            StateCondition.DISK_FULL,
        )
    for file in sorted(path.glob("state*.db")):
        if not os.access(file, os.R_OK | os.W_OK):
            owner = _owner_problem(file)
            condition, detail = owner or (StateCondition.NOT_WRITABLE, "not writable")
            raise StateDirError(
                f"state file {file}: {detail}; {_FIXES[condition]}",
                condition,
            )


def _probe_write(path: Path) -> None:
    """Create, write, sync and remove a small file in ``path``: what the store will do."""
    probe = path / _PROBE
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"\0" * 4096)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as err:
        raise os_error(err, path) from None
    finally:
        try:
            probe.unlink()
        except FileNotFoundError:
            pass
        except OSError as err:
            log.debug("write probe not removed: %s", err.__class__.__name__)


# SQLite's primary result codes (sqlite3.h) -> condition
_SQLITE_CONDITION = {
    "SQLITE_FULL": StateCondition.DISK_FULL,
    "SQLITE_READONLY": StateCondition.READ_ONLY,
    "SQLITE_CORRUPT": StateCondition.CORRUPT,
    "SQLITE_NOTADB": StateCondition.CORRUPT,
    "SQLITE_IOERR": StateCondition.IO_ERROR,
    "SQLITE_CANTOPEN": StateCondition.NOT_WRITABLE,
    "SQLITE_PERM": StateCondition.NOT_WRITABLE,
    "SQLITE_BUSY": StateCondition.IN_USE,
    "SQLITE_LOCKED": StateCondition.IN_USE,
}


def sqlite_error(err: sqlite3.Error, path: Path, doing: str) -> StateDirError:
    """A one-line error for a SQLite error on the state file ``path`` while ``doing``."""
    name = getattr(err, "sqlite_errorname", None) or err.__class__.__name__
    primary = next((p for p in _SQLITE_CONDITION if name == p or name.startswith(p + "_")), None)
    condition = _SQLITE_CONDITION[primary] if primary else StateCondition.OTHER
    if condition in (StateCondition.IO_ERROR, StateCondition.READ_ONLY, StateCondition.OTHER):
        # an I/O error while the file system is full or read-only is that condition
        condition = _file_system_condition(path) or condition
    detail = condition.value
    if condition is StateCondition.DISK_FULL:
        detail += f" ({_free(path)})"
    elif condition is StateCondition.NOT_WRITABLE:
        owner = _owner_problem(path if _exists(path) else path.parent)
        if owner is not None:
            condition, detail = owner[0], f"{owner[0].value}: {owner[1]}"
    return StateDirError(
        f"state store {path}: {detail} ({name}) while {doing}; {_FIXES[condition]}", condition
    )


def _file_system_condition(path: Path) -> StateCondition | None:
    try:
        st = os.statvfs(path.parent)
    except OSError:
        return None
    if st.f_flag & os.ST_RDONLY:
        return StateCondition.READ_ONLY
    if st.f_bavail == 0:
        return StateCondition.DISK_FULL
    return None


def check_existing_state_dir(path: Path) -> None:
    """For commands that read a worker's state: ``path`` must be an existing directory (one
    line naming it otherwise; nothing is created)."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise StateDirError(
            f"state directory {path}: {StateCondition.MISSING.value}; give the directory the "
            "worker's --state-dir / PRIVGW_STATE_DIR names",
            StateCondition.MISSING,
        ) from None
    except OSError as err:
        raise os_error(err, path) from None
    if not stat.S_ISDIR(mode):
        raise StateDirError(
            f"state directory {path}: {StateCondition.NOT_A_DIRECTORY.value}; "
            f"{_FIXES[StateCondition.NOT_A_DIRECTORY]}",
            StateCondition.NOT_A_DIRECTORY,
        )
