"""Files attached to a message: `-f PATH` on ask and chat, `/file PATH` in chat, `"files"` in a batch item.

Each file reaches the model inside the user message, before the typed text, in one format:

    <file path="src/app.py">
    ...the file's text...
    </file>

    the typed message

An MCP resource, `-f mcp:SERVER/URI`, is read from its server (llmchat.tools.mcp.sources) and attached
the same way, named `mcp:SERVER/URI`.

Blocks are separated by one blank line, in the order the files were given (a glob or a folder in
sorted order). Putting files in the message itself, rather than in a side channel, is what keeps
them in the KV cache: the next turn re-renders the same text and reuses it, and `--resume` sees
exactly what the model saw. The history keeps each attachment's path, size, SHA-256 and text apart
from the typed words (llmchat.store), and rebuilds the message with `compose`.

Refused with one line (exit 2), before anything is sent or saved: a binary file (a NUL byte in its
first 8 KiB), a file that is not UTF-8 (the first bad byte's offset is named), and a file bigger
than the room the turn can make in the context (llmchat.turn.room, which counts what trimming and
compaction would free).
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Protocol, Sequence

from llmchat.edges.bounded_input import MEDIA_BOUND, Bound, NotARegularFile, read_file, read_stream, text_bound
from llmchat.edges.safe_text import terminal_safe
from llmchat.errors import UsageError
from llmchat.output import notice
from llmchat.store.attachment_records import Attachment, prefix
from llmchat.tools.mcp.sources import MCP_REF

if TYPE_CHECKING:
    from llmchat.engine.interface import ChatEngine

BINARY_SNIFF_BYTES = 8192  # as git and grep do: a NUL byte near the start means binary
GLOB_CHARS = "*?["
STDIN = "-"


def compose(attachments: Sequence[Attachment], typed: str) -> str:
    """The user message the model sees: each file's block, then the typed text."""
    return prefix(attachments) + typed if attachments else typed


# --------------------------------------------------------------------------- reading files


def from_bytes(path: str, data: bytes) -> Attachment:
    """One attachment: an image or audio clip, recognised by its bytes (llmchat.media.kinds), or
    text. UsageError for another binary format or non-UTF-8 text."""
    from llmchat.engine.media.marks import marker
    from llmchat.media.kinds import WORKS, sniff, unsupported

    found = sniff(data)
    if found is not None:
        sha = hashlib.sha256(data).hexdigest()
        return Attachment(path=path, size=len(data), sha256=sha, text=marker(sha), media=found.kind, data=data)
    other = unsupported(data)
    if other is not None:
        raise UsageError(f"{path} is {other}, which llmchat cannot read; attach {WORKS}")
    if b"\x00" in data[:BINARY_SNIFF_BYTES]:
        raise UsageError(f"{path} is a binary file; attach text files, or {WORKS}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UsageError(
            f"{path} is not UTF-8 text (first bad byte at offset {err.start:,}); convert it first, e.g. with iconv"
        ) from None
    if "\x00" in text:
        raise UsageError(f"{path} contains NUL bytes (binary?); attach text files only")
    return Attachment(path=path, size=len(data), sha256=hashlib.sha256(data).hexdigest(), text=text)


def _bound_for(text: Bound) -> Callable[[bytes], Bound]:
    """A file's bound by its first bytes: an image's or audio clip's (llmchat.edges.bounded_input), else text's."""
    from llmchat.media.kinds import sniff

    return lambda head: MEDIA_BOUND if sniff(head) is not None else text


def _read(path: Path, shown: str, bound: Bound) -> bytes:
    try:
        return read_file(path, shown, _bound_for(bound))
    except FileNotFoundError:
        raise UsageError(f"{shown}: no such file; check the path") from None
    except PermissionError:
        raise UsageError(f"{shown} is not readable; check its permissions") from None
    except IsADirectoryError:
        raise UsageError(f"{shown} is a folder") from None


def _folder_files(folder: Path) -> list[Path]:
    """The files under `folder`, in a stable (sorted) order, hidden files and folders left out."""
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found += [Path(root) / name for name in sorted(files) if not name.startswith(".")]
    return found


def _is_text(data: bytes) -> bool:
    if b"\x00" in data[:BINARY_SNIFF_BYTES]:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def collect(
    specs: Iterable[str],
    *,
    base: Path | None = None,
    read_stdin: Callable[[], bytes] | None = None,
    resources: Callable[[str], bytes] | None = None,
    bound: Bound | None = None,
    skipped: Callable[[str], None] | None = None,
) -> list[Attachment]:
    """The attachments named by `specs`: paths, `-` (stdin), globs and folders (their text files,
    sorted; binary and non-UTF-8 members are skipped, as `grep -r` does), and `mcp:SERVER/URI`
    (its bytes read by `resources`: McpSources.resource_bytes). Relative paths are taken from `base` (the batch
    input's folder), else the current folder. A file named twice is attached once. UsageError for
    the first file that cannot be attached.

    `bound`: the most text a file may hold, what the context could (llmchat.edges.bounded_input; None: any
    context); an image or audio clip has its own. Only regular files are read: a device, FIFO or
    socket named is refused; one inside a folder or matched by a glob is skipped, and `skipped`
    (default: a notice on stderr) hears one line naming them."""
    text = bound or text_bound(None)
    attachments: list[Attachment] = []
    seen: set[str] = set()
    passed: list[str] = []

    def add(attachment: Attachment, key: str) -> None:
        if key not in seen:
            seen.add(key)
            attachments.append(attachment)

    def members_of(paths: list[Path], root: Path, spec: str) -> int:
        """Add the text files among `paths`; how many there were."""
        texts = 0
        for member in paths:
            try:
                data = _read(member, str(member), text)
            except NotARegularFile:
                passed.append(str(member))
                continue
            if _is_text(data):
                texts += 1
                add(from_bytes(_display(member, root, spec), data), str(member.resolve()))
        return texts

    for spec in specs:
        if spec == STDIN:
            data = read_stdin() if read_stdin is not None else read_stream(sys.stdin.buffer, "stdin", _bound_for(text))
            add(from_bytes("<stdin>", data), STDIN)
            continue
        if spec.startswith(MCP_REF):
            if resources is None:
                raise UsageError(f"{spec}: MCP resources are not read here; attach it with ask, chat or batch")
            add(from_bytes(spec, resources(spec)), spec)
            continue
        root = base or Path.cwd()
        expanded = os.path.expanduser(spec)
        path = Path(expanded) if os.path.isabs(expanded) else root / expanded
        if any(char in spec for char in GLOB_CHARS) and not path.exists():
            import glob  # only for a pattern

            matches = sorted(Path(m) for m in glob.glob(str(path), recursive=True))
            if not matches:
                raise UsageError(f"no file matches {spec}; check the pattern")
            members_of([f for m in matches for f in (_folder_files(m) if m.is_dir() else [m])], root, spec)
            continue
        if path.is_dir():
            if not members_of(_folder_files(path), root, spec):
                raise UsageError(f"{spec} holds no text files; attach files, not an empty or binary folder")
            continue
        add(from_bytes(spec, _read(path, spec, text)), str(path.resolve()))
    if passed:
        (skipped or notice)(f"skipped, not regular files: {', '.join(terminal_safe(name) for name in passed)}")
    return attachments


def _display(member: Path, root: Path, spec: str) -> str:
    if os.path.isabs(os.path.expanduser(spec)):
        return str(member)
    try:
        return str(member.relative_to(root))
    except ValueError:
        return str(member)


# --------------------------------------------------------------------------- the context


class Tokenizing(Protocol):
    """What a file's tokens are counted with (a chat session): its engine's tokenizer."""

    @property
    def engine(self) -> ChatEngine: ...


def tokens_of(session: Tokenizing, attachment: Attachment, *, room: int | None = None) -> tuple[int, bool]:
    """The tokens an attachment takes in the prompt, and whether that is exact; an image's or audio
    clip's are its projector's (the engine takes it now: one it cannot decode is refused). With `room`, a
    file certainly bigger than it (by the engine's lower bound) is not tokenized at all: a 2 MB
    file would take seconds; its count is then that lower bound."""
    if attachment.media:
        from llmchat.media.use import media_tokens

        return media_tokens(session.engine, attachment), True  # a server's: its estimate (media_parts)
    block = attachment.block + "\n\n"
    if room is not None:
        at_least = session.engine.min_tokens(block)
        if at_least is not None and at_least > room:
            return at_least, False
    return len(session.engine.tokenize(block, special=False)), True


def count_line(attachment: Attachment, tokens: int, n_ctx: int) -> str:
    """`notes.txt: 1,234 tokens (15% of the context)`"""
    return f"{attachment.path}: {tokens:,} tokens ({tokens / n_ctx:.0%} of the context)"
