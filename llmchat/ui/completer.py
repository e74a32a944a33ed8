"""Tab completion in the chat: command names, /set keys and preset names, /file paths and MCP
resources (`mcp:SERVER/URI`), /prompt's saved prompts and MCP prompts (`mcp:SERVER/NAME`),
/load's saved conversations and /model's models (those `llmchat models list` shows, and the
config's aliases; read once per chat).

Completion never stops typing: the chat runs it on a thread of its own (`complete_in_thread`), a
failed look-up completes nothing, and nothing slow is asked again on every key. An MCP server is
never started for it: only a running one's resources and prompts are listed (once per chat), and
the history's conversations are read once per prompt (`new_prompt`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Iterator

from prompt_toolkit.completion import CompleteEvent, Completer, Completion

from llmchat.engine.sampling import PRESETS, SETTABLE
from llmchat.ui.slash import COMMANDS

if TYPE_CHECKING:
    from prompt_toolkit.document import Document

    from llmchat.tools.mcp.sources import McpSources
    from llmchat.turn.session import ChatSession


class SlashCompleter(Completer):
    """Completes only on a line that starts with "/"."""

    def __init__(self, session: ChatSession | None = None, mcp: McpSources | None = None):
        self.session = session
        self.mcp = mcp
        self._mcp_listed: dict[tuple[str, str], list[tuple[str, str]]] = {}  # (what, server): listed once
        self._models: list[tuple[str, str]] | None = None  # /model's names, listed on first use
        self._saved_listed: list[tuple[str, str]] | None = None  # /load's, read once per prompt

    def new_prompt(self) -> None:
        """A new prompt begins: the saved conversations may have changed since the last one."""
        self._saved_listed = None

    def get_completions(self, document: Document, complete_event: CompleteEvent) -> Iterator[Completion]:
        text = document.text_before_cursor
        if not text.startswith("/") or text.startswith("//") or "\n" in text:
            return
        replaced, candidates = self.candidates(text)
        for word, meta in candidates:
            yield Completion(word, start_position=-len(replaced), display_meta=meta)

    def candidates(self, text: str) -> tuple[str, list[tuple[str, str]]]:
        """The part of the line being completed, and (completion, description) pairs for it.
        Pure apart from /load's look-up in the history, for tests."""
        if " " not in text:
            return text, [(c.name, c.help) for c in COMMANDS.values() if c.name.startswith(text.lower())]
        name, rest = text.split(" ", 1)
        name = name.lower()
        words = rest.split(" ")
        if name == "/set":
            if len(words) == 1:
                return words[0], [(key, "setting") for key in (*SETTABLE, "preset") if key.startswith(words[0].lower())]
            if len(words) == 2 and words[0].lower() == "preset":
                return words[1], [(p, _preset_meta(p)) for p in PRESETS if p.startswith(words[1].lower())]
        if name == "/image":
            return _path_candidates(rest)
        if name == "/file":
            if rest.startswith("mcp:"):
                return rest, self._mcp_candidates("resources", rest)
            typed, found = _path_candidates(rest)
            if rest and "mcp:".startswith(rest):  # `m`, `mc`...: local names and the servers both
                found += self._mcp_candidates("resources", rest)
            return typed, found
        if name == "/prompt":
            if rest.startswith("mcp:"):
                return rest, self._mcp_candidates("prompts", rest)
            config = self.session.config if self.session is not None else None
            names = sorted(config.prompts) if config is not None else []
            found = [(n, "saved prompt") for n in names if n.startswith(rest)]
            if rest and "mcp:".startswith(rest):
                found += self._mcp_candidates("prompts", rest)
            return rest, found
        if name == "/model":
            if rest.startswith(("/", ".", "~")):  # a .gguf path
                return _path_candidates(rest)
            return rest, [(n, meta) for n, meta in self._model_names() if n.lower().startswith(rest.lower())]
        if name == "/load":
            # The whole rest of the line is the reference: names may contain spaces.
            return rest, [(ref, meta) for ref, meta in self._saved() if ref.startswith(rest)]
        return text, []

    def _mcp_servers(self) -> list[str]:
        return self.mcp.server_names() if self.mcp is not None else []

    def _mcp_candidates(self, what: str, typed: str) -> list[tuple[str, str]]:
        """`mcp:` completes to `mcp:SERVER/`; `mcp:SERVER/...` to that server's resources (or
        prompts) when it runs already (a /file, /resources or tool call started it), listed once
        per chat. A server that is not running completes nothing: a key never starts one."""
        server, slash, _ = typed[len("mcp:") :].partition("/")
        if not slash or not typed.startswith("mcp:"):
            return [(f"mcp:{name}/", "MCP server") for name in self._mcp_servers() if f"mcp:{name}/".startswith(typed)]
        key = (what, server)
        if key not in self._mcp_listed:
            from llmchat.tools.mcp.sources import listing_lines

            try:
                if self.mcp is None or self.mcp.running(server) is None:
                    return []  # asked again once it runs
                self._mcp_listed[key] = []  # the keys typed while it answers find it listing already
                self._mcp_listed[key] = [_split_listing(line) for line in listing_lines(self.mcp, what, server)]
            except Exception:  # completion must never break typing (a server that fails to answer)
                pass
        return [(ref, meta) for ref, meta in self._mcp_listed[key] if ref.startswith(typed)]

    def _model_names(self) -> list[tuple[str, str]]:
        if self._models is None:
            from llmchat.ui.model_commands import model_names

            try:
                self._models = model_names(self.session.config if self.session is not None else None)
            except Exception:  # completion must never break typing
                self._models = []
        return self._models

    def _saved(self) -> list[tuple[str, str]]:
        if self._saved_listed is None:
            self._saved_listed = self._read_saved()
        return self._saved_listed

    def _read_saved(self) -> list[tuple[str, str]]:
        store = self.session.history if self.session is not None else None
        if store is None:
            return []
        try:
            summaries = store.list_conversations(limit=50)
        except Exception:  # completion must never break typing
            return []
        found = []
        for summary in summaries:
            if summary.name:
                found.append((summary.name, summary.preview))
            found.append((summary.id, summary.name or summary.preview))
        return found


def _path_candidates(typed: str) -> tuple[str, list[tuple[str, str]]]:
    """Completions of the last path component; folders end with a slash. Hidden names only when
    the component starts with a dot."""
    folder, start = os.path.split(typed)
    where = os.path.expanduser(folder) or "."
    try:
        names = sorted(os.listdir(where))
    except OSError:
        return start, []
    found = []
    for name in names:
        if not name.startswith(start) or (name.startswith(".") and not start.startswith(".")):
            continue
        is_dir = os.path.isdir(os.path.join(where, name))
        found.append((name + ("/" if is_dir else ""), "folder" if is_dir else "file"))
    return start, found


def _split_listing(line: str) -> tuple[str, str]:
    """A /resources or /prompts line as (reference, description)."""
    ref, _, meta = line.partition(" ")
    return ref, meta.strip()


def _preset_meta(name: str) -> str:
    return ", ".join(f"{k}={v}" for k, v in PRESETS[name].items() if k in ("temperature", "top_k", "top_p"))
