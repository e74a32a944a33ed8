"""/copy: the last reply, or one of its fenced code blocks, to the clipboard through OSC 52.

OSC 52 (`ESC ] 52 ; c ; BASE64 BEL`) asks the terminal itself to set its clipboard, so it works
where a clipboard program cannot: over SSH, in a container, in tmux. Inside tmux ($TMUX set) the
sequence goes twice, as tmux has two ways to let it through and each is off by default: plain,
which tmux takes into its paste buffer and passes on with `set -g set-clipboard on`, then wrapped
in tmux's DCS passthrough (`ESC P tmux ; ...ESC\\`, every ESC inside doubled), which reaches the
outer terminal with `set -g allow-passthrough on` (tmux 3.3+). Either way the text is the same.

A terminal that cannot take it (not a terminal at all, TERM unset, `dumb`, or `linux`, the
console) gets nothing written to it: the text goes to a private file (0600 in a 0700 folder,
replaced by the next /copy) whose path is printed. The same happens with the environment
variable LLMCHAT_CLIPBOARD=file, for terminals that ignore OSC 52 without saying so. The file
holds part of a conversation, so it lives where the conversation does: in llmchat's cache folder
where the chat is saved (`history rm` of the conversation it came from removes it), and in the
process's temporary folder, removed at exit, where it is not (`--no-history`).
"""

from __future__ import annotations

import base64
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Mapping

from llmchat import paths
from llmchat.output import is_tty
from llmchat.private_files import ensure_private_dir, temporary_dir, write_private_atomic
from llmchat.ui.context import CONTINUE, CommandContext, Outcome

if TYPE_CHECKING:
    from llmchat.turn.conversation import Conversation

ESC, BEL = "\x1b", "\x07"
NO_OSC52_TERMS = ("", "dumb", "linux")
FORCE_FILE_VARIABLE = "LLMCHAT_CLIPBOARD"
FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})(.*)$")


def osc52(text: str, *, tmux: bool = False) -> str:
    """The escape sequence that puts `text` on the terminal's clipboard (`c`: the clipboard); in
    tmux, plain and then in tmux's passthrough (see above)."""
    payload = base64.b64encode(text.encode("utf-8")).decode("ascii")
    sequence = f"{ESC}]52;c;{payload}{BEL}"
    if tmux:
        return sequence + f"{ESC}Ptmux;{sequence.replace(ESC, ESC + ESC)}{ESC}\\"
    return sequence


def takes_osc52(stream: IO[str], environ: Mapping[str, str]) -> bool:
    """Whether to send OSC 52 to `stream`: a terminal that is not a bare console, and not refused."""
    if environ.get(FORCE_FILE_VARIABLE, "").lower() == "file":
        return False
    return is_tty(stream) and environ.get("TERM", "") not in NO_OSC52_TERMS


def clipboard_file(saved_conversation: bool = True) -> Path:
    """Where /copy puts the text when the terminal cannot take it: the cache folder's file for a
    saved conversation (`history rm` removes it), else one in the temporary folder that goes at exit."""
    return (paths.cache_dir() if saved_conversation else temporary_dir()) / "clipboard.txt"


@dataclass(frozen=True)
class Copied:
    """How the text left: through the terminal (file None), or into `file`."""

    characters: int
    file: Path | None = None


def copy_text(
    text: str, stream: IO[str], environ: Mapping[str, str] | None = None, *, saved_conversation: bool = True
) -> Copied:
    """Put `text` on the clipboard through `stream` (OSC 52), or into clipboard_file()."""
    environ = os.environ if environ is None else environ
    if takes_osc52(stream, environ):
        stream.write(osc52(text, tmux=bool(environ.get("TMUX"))))
        stream.flush()
        return Copied(len(text))
    target = clipboard_file(saved_conversation)
    ensure_private_dir(target.parent)  # the first file llmchat writes may be this one
    write_private_atomic(target, text.encode("utf-8"))
    return Copied(len(text), target)


def code_blocks(markdown: str) -> list[str]:
    """The fenced code blocks of a reply (``` or ~~~), in order, without their fences. As in
    CommonMark, an unclosed fence runs to the end, and a fence indented by N spaces takes up to N
    spaces off each line inside it."""
    blocks: list[str] = []
    lines = markdown.split("\n")
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        index += 1
        if opening is None or (opening.group(2)[0] == "`" and "`" in opening.group(3)):
            continue
        indent, fence = len(opening.group(1)), opening.group(2)
        body: list[str] = []
        while index < len(lines):
            closing = FENCE.match(lines[index])
            index += 1
            if closing and closing.group(2)[0] == fence[0] and len(closing.group(2)) >= len(fence):
                if not closing.group(3).strip():
                    break
            line = lines[index - 1]
            body.append(line[min(indent, len(line) - len(line.lstrip(" "))) :])
        blocks.append("\n".join(body))
    return blocks


def last_reply(conversation: Conversation) -> str | None:
    """The reply that ends the conversation (None before the first one, or after /undo of it)."""
    messages = conversation.messages
    if not messages or messages[-1]["role"] != "assistant":
        return None
    return str(messages[-1]["content"])


def cmd_copy(ctx: CommandContext, arg: str) -> Outcome:
    """`/copy [N]`: the last reply, or its fenced code block N (1-based), to the clipboard."""
    reply = last_reply(ctx.session.conversation)
    if reply is None:
        ctx.error("nothing to copy yet: /copy copies the last reply once there is one")
        return CONTINUE
    blocks = code_blocks(reply)
    text, what = reply, "the last reply"
    if arg:
        count = f"{len(blocks)} code block" + ("" if len(blocks) == 1 else "s")
        if not blocks:
            ctx.error("the last reply has no code blocks; /copy copies all of it")
            return CONTINUE
        if not arg.isdigit() or not 1 <= int(arg) <= len(blocks):
            ctx.error(f"usage: /copy [N], N a code block 1..{len(blocks)} (the last reply has {count}); got {arg!r}")
            return CONTINUE
        text, what = blocks[int(arg) - 1], f"code block {arg} of {len(blocks)}"
    saved = ctx.session.history is not None  # history off: the file goes when the chat ends
    try:
        copied = copy_text(text, ctx.out.file, saved_conversation=saved)
    except OSError as err:
        ctx.error(f"error: cannot write {clipboard_file(saved)}: {err.strerror or err}")
        return CONTINUE
    size = f"{copied.characters:,} characters"
    if copied.file is None:
        hint = f" · /copy N copies code block N (1..{len(blocks)})" if blocks and not arg else ""
        ctx.info(f"copied {what} to the clipboard ({size}, OSC 52){hint}")
    else:
        ctx.info(f"this terminal cannot take OSC 52: {what} ({size}) is in {copied.file}")
    return CONTINUE
