"""Files that hold a user's conversations, created readable by that user alone.

A chat history holds what people would not say aloud. Shells keep their history 0600 and ssh
refuses keys that others can read; llmchat does the same for everything it creates that holds a
conversation (history database, input history, KV-cache files, exports): folders 0700, files
0600, whatever the umask. Files are created with their mode (`os.open(..., mode)` under a umask of
0o077), never created first and chmod-ed after, so there is no window in which another account
can open them.

Where a conversation is kept off the disk (`--no-history`) but a file must still be written for it
(an image an MCP tool returned, the /copy fallback), it goes to `temporary_dir()`: a private
folder of this process that is removed, with what it holds, when the process exits.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


@contextlib.contextmanager
def private_umask() -> Iterator[None]:
    """Everything created inside is private (0600 files, 0700 folders), e.g. SQLite's own files
    (`-wal`, `-shm`), which the library creates with the process umask."""
    previous = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(previous)


def ensure_private_dir(path: Path) -> Path:
    """Create `path` (and missing parents) as 0700. An existing folder keeps its mode: it may be
    one the user chose (LLMCHAT_HOME)."""
    with private_umask():
        path.mkdir(parents=True, exist_ok=True)
    return path


def own_private_dir(path: Path) -> Path:
    """`ensure_private_dir` for a folder that is llmchat's own (inside its cache folder, never one
    the user chose): one an earlier version created with the umask (0755) is made 0700 too."""
    ensure_private_dir(path)
    if too_open(path):
        with contextlib.suppress(OSError):  # not ours to change (another owner): leave it
            os.chmod(path, PRIVATE_DIR_MODE)
    return path


_temporary: list[Path] = []  # this process's temporary folder, once made


def temporary_dir() -> Path:
    """This process's private temporary folder (0700, in the system's temp folder), made on first
    use and removed with everything in it when the process exits (Ctrl-C and SIGTERM included:
    llmchat.launch removes it before such an exit). For files a conversation that is not saved still
    needs."""
    if not _temporary:
        folder = Path(tempfile.mkdtemp(prefix="llmchat-"))  # mkdtemp makes it 0700
        atexit.register(remove_temporary_dir)
        _temporary.append(folder)
    return _temporary[0]


def remove_temporary_dir() -> None:
    """Remove this process's temporary folder, if it made one (at exit)."""
    while _temporary:
        shutil.rmtree(_temporary.pop(), ignore_errors=True)


def open_private(path: Path, flags: int = os.O_WRONLY | os.O_CREAT | os.O_TRUNC) -> int:
    """`os.open` that creates a missing file as 0600 whatever the umask; returns the descriptor."""
    with private_umask():
        return os.open(path, flags, PRIVATE_FILE_MODE)


def write_private_atomic(path: Path, data: bytes, *, fsync: bool = False) -> None:
    """Write `data` to `path` whole or not at all (temp file in the same folder, then rename), as 0600.

    Two processes writing the same path at once each write their own temp file; the last rename
    wins and no reader ever sees a torn file."""
    with private_umask():
        handle, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            if fsync:
                out.flush()
                os.fsync(out.fileno())
        os.replace(temp_name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp_name)
        raise


def too_open(path: Path) -> bool:
    """Whether group or others may read or write `path` (an older version created it so)."""
    try:
        return bool(path.stat().st_mode & 0o077)
    except OSError:
        return False


def tighten(files: list[Path]) -> list[Path]:
    """Make each existing file in `files` that group or others may open 0600; returns those changed.

    For files an earlier llmchat created with the umask (0644 under the usual 022). Runs on every
    open, but only changes anything once: a tightened file is no longer too open."""
    changed = []
    for path in files:
        if path.is_file() and too_open(path):
            with contextlib.suppress(OSError):  # not ours to change (another owner): leave it
                os.chmod(path, PRIVATE_FILE_MODE)
                changed.append(path)
    return changed


def tightened_notice(files: list[Path]) -> str:
    """The one line that names the files `tighten` changed."""
    return "made readable by you alone (0600), as other accounts could read them: " + ", ".join(map(str, files))
