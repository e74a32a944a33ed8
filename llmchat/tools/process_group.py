"""Ending a child's whole process group: what llmchat starts (a command tool, an MCP server over
stdio) runs in a session of its own, so that it can be ended with everything it started.

A group is ended with SIGTERM, then SIGKILL to whatever is left after a short grace. `killpg`
reaches every member at once, also a grandchild whose parent already exited and that still holds
the pipes llmchat reads (a shell's `sleep 1000 &`): waiting for those pipes' end of file, or for
the leader alone, left such a grandchild running after llmchat ended. A process that made a session
of its own (a daemon) has left the group on purpose, and is not reached.

The group's id is its leader's pid (started with `start_new_session=True`), never `getpgid()`,
which fails once the leader is reaped while members live on. A group is gone when `killpg(pgid, 0)`
says ESRCH (the kernel does not give that id to a new process while any member of the group lives),
or, where /proc tells, when every member left is a zombie: a killed grandchild is reaped by the
system's init, which in a container (a PID 1 that is not an init) may never do it, and waiting for
that cost every call the whole grace.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

# SIGTERM, then this long for the group to end by itself, then SIGKILL: a Ctrl-C is done well
# within a second even with a child that ignores SIGTERM.
TERM_GRACE_S = 0.5
POLL_S = 0.01


def signal_group(pgid: int, signum: int) -> bool:
    """Send `signum` to the group; False when it is gone (EPERM is not proof of that)."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def group_alive(pgid: int) -> bool:
    """Whether a member of the group still runs (a zombie does not)."""
    if not signal_group(pgid, 0):
        return False
    try:
        entries = os.listdir("/proc")
    except OSError:  # no /proc (macOS): the signal's answer is all there is
        return True
    return any(_running_in(entry, pgid) for entry in entries if entry.isdigit())


def _running_in(pid: str, pgid: int) -> bool:
    """Whether /proc/PID/stat names a process of group `pgid` that is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()  # after the name, which may hold anything
    except (OSError, IndexError):  # it ended meanwhile
        return False
    return len(fields) > 2 and fields[2] == str(pgid).encode() and fields[0] not in (b"Z", b"X")


def end_group(pgid: int, reap: Callable[[], object], grace_s: float = TERM_GRACE_S) -> None:
    """SIGTERM to the group, up to `grace_s` for it to end, then SIGKILL to what is left. `reap`
    collects the leader if it exited (a zombie leader keeps the group). A second Ctrl-C during the
    grace cuts it short, and the SIGKILL still goes."""
    if not signal_group(pgid, signal.SIGTERM):
        reap()
        return
    gone = False
    try:
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            reap()
            if not group_alive(pgid):
                gone = True
                return
            time.sleep(POLL_S)
    finally:
        if not gone:
            signal_group(pgid, signal.SIGKILL)
