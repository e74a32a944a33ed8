"""Run a server tied to the test session: it ends when the session ends, however the session ends.

    python tether.py PROGRAM ARGS...      (stdin: a pipe whose other end only the session holds)

Started in a process group of its own (harness.start_tethered), this forks a watchdog and then
becomes the server (exec: the pid the session knows is the server's). The watchdog reads the pipe
until its end, which comes when the session closes it (harness's stop) or exits, even killed by
SIGKILL or a Ctrl-C that skipped the fixtures' teardown (the kernel closes it then); it then ends
the whole group: the server, whatever the server started, and itself. A server started without it
ran on after a killed pytest, holding its port and its cores.
"""

import os
import signal
import sys
import time

GRACE_S = 5.0  # between SIGTERM and SIGKILL, for a server that saves nothing but may be slow to stop
POLL_S = 0.05


def watch(group: int) -> None:
    """Wait for the end of stdin, then end the group (this process is in it: the SIGKILL ends it too)."""
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the watchdog outlives its own SIGTERM
    try:
        os.killpg(group, signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline and _others_in(group):
            time.sleep(POLL_S)
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os._exit(0)


def _others_in(group: int) -> bool:
    """Whether a process of the group but this one still runs (a zombie does not)."""
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[2] == str(group).encode() and fields[0] not in (b"Z", b"X"):
            return True
    return False


def main() -> None:
    group = os.getpgrp()
    if os.fork() == 0:
        watch(group)
    devnull = os.open(os.devnull, os.O_RDONLY)  # the server reads nothing from the session's pipe
    os.dup2(devnull, 0)
    os.close(devnull)
    os.execvp(sys.argv[1], sys.argv[1:])


if __name__ == "__main__":
    main()
