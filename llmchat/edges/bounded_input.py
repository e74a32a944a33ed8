"""Everything llmchat reads whole from outside, read one way: regular files only, and never more
than a bound.

What comes through here: `-f FILE` and each file of `-f FOLDER` or a glob, `/file` and `/image`,
piped stdin for `ask` (the prompt, or `-f -`) and `chat` (its lines), `batch`'s input lines,
`--schema`, `--tools` and `--functions` files, `--grammar` and `--template` files, and the config file.

- Only regular files. A path is opened with O_NONBLOCK, so that opening a FIFO cannot wait for a
  writer, and the opened descriptor's `fstat` decides: a device (`/dev/zero` never ends), a FIFO or
  a socket (which cannot even be opened) is refused in one line, `NotARegularFile`, that says what
  it is and what to do. Inside a folder such an entry is skipped, and named in one notice.
- Never more than the bound + 1 byte: the extra byte only says "over". A regular file whose size
  already says so is refused unread; one that grows while it is read stops at the same byte.
- The bound of text that goes into a prompt is what the context could hold: its size in tokens
  times `BYTES_PER_TOKEN`. Where the context is not known before the read (a server's, asked
  only once connected), `ANY_CONTEXT_TOKENS` stands for it. Text over the bound cannot fit, so it
  is refused at once, with memory bounded by the bound, instead of being read, decoded and
  tokenized first: `head -c 3000000000 /dev/zero | llmchat ask hi` grew to 8.9 GB before this.
  Text under it is still counted in tokens by the turn, which refuses or trims as before.
- Images and audio are not text: their bound is `MEDIA_MAX_BYTES`, whatever the context.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Union

from llmchat.errors import ExitCode, LlmchatError, UsageError

# Bytes of text one token stands for, at most. Measured on the test models' vocabularies
# (2026-12, llama-cpp-python 0.3.36): prose and code take 3.5 bytes a token on both, indented code
# 13 (Gemma 3) to 22 (SmolLM2), and the worst, a run of spaces, 31 on Gemma 3 and 64 on SmolLM2.
# At 64 no text that fits a context is refused by its bytes; a context of 8,192 tokens still reads
# no more than 512 KiB.
BYTES_PER_TOKEN = 64
# The context when it is not known before the read (a server's): the longest any model trains for
# today, about a million tokens; 64 MiB of text.
ANY_CONTEXT_TOKENS = 1 << 20
# Images and audio: a 48-megapixel PNG or a 6-minute 16-bit stereo WAV fits; the projector shrinks
# any image to its own few hundred tokens anyway.
MEDIA_MAX_BYTES = 64 * 1024 * 1024
_CHUNK = 1 << 20  # bytes per read: big enough to be fast, small enough that the last one wastes little


@dataclass(frozen=True)
class Bound:
    """The most bytes a read takes (`size`; one more only says "over"), and what that size is, for
    the line that refuses more ("a 8,192-token context can hold")."""

    size: int
    holds: str


def text_bound(context_tokens: int | None) -> Bound:
    """The bound of text that goes into a prompt: what a context of `context_tokens` (None: not
    known yet) could hold."""
    if context_tokens is None:
        return Bound(ANY_CONTEXT_TOKENS * BYTES_PER_TOKEN, "any context can hold")
    return Bound(max(context_tokens, 1) * BYTES_PER_TOKEN, f"a {context_tokens:,}-token context can hold")


MEDIA_BOUND = Bound(MEDIA_MAX_BYTES, "llmchat takes for an image or audio clip")
# Files read before any context is known and not attached to a message (a schema, a grammar, a
# template, tools, the config): what any context could hold.
ANY_TEXT = text_bound(None)
# A bound chosen by the first bytes of a file (an image's signature): see `read_file`.
BoundFor = Union[Bound, Callable[[bytes], Bound]]
HEAD_BYTES = 64  # what a `BoundFor` callable sees: enough for every signature llmchat.media.kinds reads


class NotARegularFile(UsageError):
    """A path that names a device, a FIFO or a socket: never read (it may never end, or wait forever)."""

    def __init__(self, shown: str, kind: str, advice: str):
        super().__init__(f"{shown} is {kind}, not a regular file; {advice}")
        self.shown = shown
        self.kind = kind


class TooLong(LlmchatError):
    """Input over its bound, refused after reading the bound + 1 byte."""


def kind_of(mode: int) -> str | None:
    """What a file of this mode is, in words, where it is not a regular file (None: it is one)."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a file"


NOT_REGULAR_ADVICE = "attach a regular file (pipe a stream's output in with -f -)"
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)


def open_regular(path: Path, shown: str, *, advice: str = NOT_REGULAR_ADVICE) -> tuple[int, int]:
    """(descriptor, size) of a regular file, opened without waiting for anything. NotARegularFile
    for anything else; OSError (FileNotFoundError, PermissionError, ...) as `os.open` raises it.
    The caller closes the descriptor."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as err:
        # A socket cannot be opened (ENXIO); a FIFO or device may refuse too (EAGAIN, ENODEV):
        # say what it is rather than the errno's words.
        try:
            mode = os.stat(path).st_mode
        except OSError:
            raise err from None
        kind = kind_of(mode)
        if kind is None or stat.S_ISDIR(mode):
            raise
        raise NotARegularFile(shown, kind, advice) from None
    try:
        info = os.fstat(fd)
        kind = kind_of(info.st_mode)
        if kind is not None:
            if stat.S_ISDIR(info.st_mode):
                raise IsADirectoryError(21, "Is a directory", str(path))
            raise NotARegularFile(shown, kind, advice)
    except BaseException:
        os.close(fd)
        raise
    return fd, info.st_size


def read_file(path: Path, shown: str, bound: BoundFor, *, advice: str = NOT_REGULAR_ADVICE) -> bytes:
    """The bytes of the regular file at `path`, shown to the user as `shown`. `bound`: a Bound, or
    a function of the file's first `HEAD_BYTES` bytes that gives it (an image's or a text's).
    NotARegularFile, TooLong (exit 2), or OSError as opening it raises."""
    fd, size = open_regular(path, shown, advice=advice)
    with os.fdopen(fd, "rb", buffering=0) as handle:
        head = b""
        if not isinstance(bound, Bound):
            head = handle.read(HEAD_BYTES)  # a regular file gives what it has
            bound = bound(head)
        data = None if size > bound.size else _within(handle, bound.size - len(head))
    if data is None:  # its size said so, or it grew while it was read
        raise TooLong(
            f"{shown} does not fit: it is more than {bound.size:,} bytes, more than {bound.holds}; "
            "give a smaller file, or a part of it",
            exit_code=ExitCode.USAGE,
        )
    return head + data


def check_file(path: Path, shown: str, bound: Bound, *, advice: str = NOT_REGULAR_ADVICE) -> None:
    """`read_file`'s refusals, for a file that something else reads (Python imports a --functions file)."""
    fd, size = open_regular(path, shown, advice=advice)
    os.close(fd)
    if size > bound.size:
        raise TooLong(
            f"{shown} is more than {bound.size:,} bytes, more than {bound.holds}; pass a smaller file",
            exit_code=ExitCode.USAGE,
        )


def read_stream(
    stream: BinaryIO, shown: str, bound: BoundFor, *, exit_code: ExitCode = ExitCode.USAGE, advice: str = ""
) -> bytes:
    """All of a stream (piped stdin) up to its end, or TooLong (with `exit_code`) once it holds more
    than `bound` (a Bound, or one chosen by the first bytes, as for `read_file`): never more than
    bound + 1 bytes are taken from it."""
    head = b""
    if not isinstance(bound, Bound):
        while len(head) < HEAD_BYTES and (more := stream.read(HEAD_BYTES - len(head))):  # a pipe gives what it has
            head += more
        bound = bound(head)
    rest = _within(stream, bound.size - len(head))
    data = None if rest is None else head + rest
    if data is None:
        raise TooLong(
            f"{shown} cannot fit: it holds more than {bound.size:,} bytes, more than {bound.holds}; "
            + (advice or "pipe a part of it (e.g. through head -c)"),
            exit_code=exit_code,
        )
    return data


def read_line(stream: BinaryIO, shown: str, bound: Bound, *, exit_code: ExitCode = ExitCode.USAGE) -> bytes:
    """One line of a stream, its newline included (b"" at the end), or TooLong once a line holds
    more than `bound`: a stream with no newline (`/dev/zero`) is not read to its end to find one.
    After TooLong the rest of that line is still in the stream (`skip_line`)."""
    line = stream.readline(bound.size + 1)
    if len(line) > bound.size and not line.endswith(b"\n"):
        raise TooLong(
            f"{shown} cannot fit: it is longer than {bound.size:,} bytes, more than {bound.holds}; split it",
            exit_code=exit_code,
        )
    return line


def skip_line(stream: BinaryIO) -> None:
    """Read past the rest of a line, a chunk at a time: what it holds is dropped as it comes."""
    while True:
        chunk = stream.readline(_CHUNK)
        if not chunk or chunk.endswith(b"\n"):
            return


def _within(stream: BinaryIO, limit: int) -> bytes | None:
    """The rest of the stream if it holds at most `limit` bytes, else None; read in chunks (a pipe
    gives less than asked at a time), and never more than `limit` + 1 bytes of it. The chunks of
    a stream over the limit are dropped unjoined: it costs the limit in memory, not twice that."""
    parts: list[bytes] = []
    taken = 0
    while taken <= limit:
        chunk = stream.read(min(limit + 1 - taken, _CHUNK))
        if not chunk:
            return b"".join(parts)
        parts.append(chunk)
        taken += len(chunk)
    return None
