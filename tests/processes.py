"""Looking for processes the tests started (psutil is not a dependency: /proc and signal 0).

A process is running while its pid answers signal 0 and /proc does not call it a zombie: a killed
grandchild is a zombie until the system's init reaps it, and in a container that may be never.
Every wait is for an event (a file appears, a process goes), bounded in time so that a broken run
fails instead of hanging the suite.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

WAIT_LIMIT_S = 120.0
POLL_S = 0.02


def running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def pid_in(path: Path) -> int:
    return int(path.read_text(encoding="utf-8").strip())


def wait_for_file(path: Path, process: subprocess.Popen | None = None, limit_s: float = WAIT_LIMIT_S) -> None:
    """Until the file holds something (the event), failing at once if `process` ends first."""
    deadline = time.monotonic() + limit_s
    while not (path.exists() and path.read_text(encoding="utf-8").strip()):
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the process ended ({process.returncode}) before {path.name} appeared")
        time.sleep(POLL_S)


def wait_gone(pids: Iterable[int], limit_s: float = WAIT_LIMIT_S) -> list[int]:
    """Wait until none of the pids runs; the ones still running at the limit."""
    deadline = time.monotonic() + limit_s
    left = [pid for pid in pids if running(pid)]
    while left and time.monotonic() < deadline:
        time.sleep(POLL_S)
        left = [pid for pid in left if running(pid)]
    return left
