"""`llmchat history` commands: list, show, search, export and remove saved conversations.

Only typer and the environment are imported at the top so `llmchat --help` stays fast; the
store, rich and the error types are imported inside the commands that use them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from llmchat.env import current_environment

if TYPE_CHECKING:
    from llmchat.store.history import HistoryStore

EXPORT_FORMATS = ("json", "markdown")


def _open_store(*, reading: bool = True) -> HistoryStore | None:
    """The store, or None when there is no history yet: reading must not create the database.
    `reading`: where the database cannot be opened for writing (a read-only folder), read it as is."""
    from llmchat.errors import HistoryError
    from llmchat.output import notice
    from llmchat.store.history import HistoryStore

    path = current_environment().history_db
    if not path.exists():
        return None
    try:
        return HistoryStore.open(path, warn=lambda message: notice(f"llmchat: {message}"))
    except HistoryError:
        if not reading:
            raise
        return HistoryStore.open_read_only(path)


def _no_history_error(ref: str):
    from llmchat.errors import UsageError

    return UsageError(f"no conversation matches {ref!r}: the history is empty")


def _load(ref: str):
    store = _open_store()
    if store is None:
        raise _no_history_error(ref)
    with store:
        return store.get(ref)


def list_command(
    limit: int = typer.Option(50, "--limit", "-n", help="Show at most this many conversations."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON array instead of a table."),
) -> None:
    """List conversations, most recently updated first."""
    if limit < 1:
        from llmchat.errors import UsageError

        raise UsageError(f"--limit must be at least 1, not {limit}")
    store = _open_store()
    summaries = []
    if store is not None:
        with store:
            summaries = store.list_conversations(limit=limit)
    if as_json:
        _print_summaries_json(summaries)
    elif not summaries:
        typer.echo("No conversations yet.", file=current_environment().stdout)
    else:
        _print_summaries_table(summaries)


def _print_summaries_json(summaries: list) -> None:
    import json
    from dataclasses import asdict

    typer.echo(
        json.dumps([asdict(s) for s in summaries], indent=2, ensure_ascii=False), file=current_environment().stdout
    )


def _print_summaries_table(summaries: list) -> None:
    from rich.table import Table

    from llmchat.ui.safe_console import safe_console

    # A pipe is not 80 columns wide: don't clip what a script may grep or cut.
    env = current_environment()
    console = safe_console(env.stdout, on_terminal=env.stdout_isatty, width=None if env.stdout_isatty else 1000)
    headers: tuple[str, ...] = ("ID", "Name", "Model", "Updated (UTC)", "Msgs", "Branch of", "Branches")
    rows: list[tuple[str, ...]] = [
        (
            s.id,
            s.name or "",
            s.model,
            _short_time(s.updated_at),
            str(s.n_messages),
            f"{s.parent_id} @{s.branch_at}" if s.parent_id else "",
            str(s.children) if s.children else "",
        )
        for s in summaries
    ]
    if not any(s.parent_id or s.children for s in summaries):  # no branches: no columns for them
        headers, rows = headers[:5], [row[:5] for row in rows]
    fixed_width = sum(max(len(text) for text in column) for column in zip(headers, *rows))
    gaps = 2 * len(headers)  # two spaces between columns, the preview included
    preview_width = min(console.width - fixed_width - gaps, max(len(s.preview) for s in summaries))

    table = Table(box=None, header_style="bold", pad_edge=False)
    for header in headers:
        # Ids are what the other commands take: no column may wrap or clip them.
        table.add_column(header, no_wrap=True, justify="right" if header in ("Msgs", "Branches") else "left")
    # Only the preview gives way on a narrow terminal, and goes when there is no room left.
    show_preview = preview_width >= 12
    if show_preview:
        table.add_column("First message", no_wrap=True, overflow="ellipsis", width=preview_width)
    for row, summary in zip(rows, summaries):
        table.add_row(*row, *([summary.preview] if show_preview else []))
    console.print(table)


def _short_time(iso: str) -> str:
    """'2024-05-01T12:34:56.123456+00:00' -> '2024-05-01 12:34'."""
    return iso[:16].replace("T", " ")


def search_command(
    words: list[str] = typer.Argument(
        ..., metavar="TEXT...", help='Words to find; FTS5 syntax works too: "a phrase", prefix*, OR, NOT.'
    ),
    limit: int = typer.Option(20, "--limit", "-n", help="Show at most this many matches."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON array of matches instead of a table."),
) -> None:
    """Search every saved conversation's messages (SQLite FTS5), best match first: the
    conversation, the turn and a snippet with the match marked. `chat --resume ID` or /load ID
    continues one."""
    import json

    from llmchat.errors import UsageError

    if limit < 1:
        raise UsageError(f"--limit must be at least 1, not {limit}")
    text = " ".join(words)
    if not text.strip():
        raise UsageError("give the text to search for")
    store = _open_store()
    hits = []
    if store is not None:
        with store:
            hits = store.search(text, limit)
    env = current_environment()
    if as_json:
        typer.echo(json.dumps([hit.as_json() for hit in hits], indent=2, ensure_ascii=False), file=env.stdout)
    elif not hits:
        env.write_err(f"No saved message matches {text!r}.\n")
    else:
        from llmchat.ui.safe_console import safe_console
        from llmchat.ui.search_commands import results_table

        console = safe_console(env.stdout, on_terminal=env.stdout_isatty, width=None if env.stdout_isatty else 1000)
        console.print(results_table(hits, styled=env.stdout_isatty))


def show_command(
    ref: str = typer.Argument(..., metavar="ID", help="Conversation id, unique id prefix, name, or 'last'."),
    as_json: bool = typer.Option(False, "--json", help="Print the conversation as JSON."),
) -> None:
    """Show one conversation: header and every turn."""
    from llmchat.store.export import export_json, export_markdown

    conv = _load(ref)
    if as_json:
        typer.echo(export_json(conv), nl=False, file=current_environment().stdout)
        return
    env = current_environment()
    if env.stdout_isatty:  # drawn as the chat draws a reply: made terminal-safe, links' addresses shown
        from llmchat.ui.markdown_stream import terminal_markdown
        from llmchat.ui.safe_console import safe_console

        safe_console(env.stdout, on_terminal=True).print(terminal_markdown(export_markdown(conv)))
    else:
        env.write_out(export_markdown(conv))
    if conv.parent_id is not None or conv.children:
        _print_tree(conv.id)


def _print_tree(conversation_id: str) -> None:
    """The branches this conversation belongs to, drawn as a tree (llmchat.turn.branches)."""
    from llmchat.turn.branches import draw_tree

    store = _open_store()
    if store is None:
        return
    with store:
        family = store.family(conversation_id)
    env = current_environment()
    env.write_out("\n## Branches\n\n")
    for line in draw_tree(family, current=conversation_id):  # names the branches: the user's, a file's
        env.write_out(line + "\n")


def fork_command(
    ref: str = typer.Argument(..., metavar="ID", help="Conversation id, unique id prefix, name, or 'last'."),
    at: int = typer.Option(..., "--at", help="Share turns 1..N with the new branch (0: only the system prompt)."),
    name: Optional[str] = typer.Option(None, "--name", help="Name the new branch."),
) -> None:
    """Start a branch: a new conversation sharing turns 1..N with ID. Prints its id; continue it
    with `llmchat ask -c --cid NEWID "..."` or `llmchat chat --resume NEWID`."""
    store = _open_store(reading=False)
    if store is None:
        raise _no_history_error(ref)
    with store:
        branch = store.fork(ref, at, name=name)
    typer.echo(branch, file=current_environment().stdout)


def export_command(
    ref: str = typer.Argument(..., metavar="ID", help="Conversation id, unique id prefix, name, or 'last'."),
    fmt: str = typer.Option("markdown", "--format", "-f", help="json or markdown."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write to this file instead of stdout."),
) -> None:
    """Export a conversation as JSON or Markdown."""
    from llmchat.errors import UsageError
    from llmchat.store.export import export_json, export_markdown

    fmt = fmt.lower()
    if fmt not in EXPORT_FORMATS:
        raise UsageError(f"--format must be json or markdown, not {fmt!r}")
    conv = _load(ref)
    text = export_json(conv) if fmt == "json" else export_markdown(conv)
    if output is None:
        env = current_environment()
        if fmt == "json":  # a record, written as it is (JSON escapes its control characters)
            typer.echo(text, nl=False, file=env.stdout)
        else:  # on a terminal, made terminal-safe; in a pipe, the exact text
            env.write_out(text)
        return
    write_atomically(output, text)
    current_environment().write_err(f"exported conversation {conv.id} to {output}\n")


def write_atomically(target: Path, text: str) -> None:
    """Write via a temp file in the same folder + os.replace, so `target` is never half-written."""
    import os
    import tempfile

    from llmchat.errors import LlmchatError

    target = target.expanduser()
    try:
        fd, temp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as err:
        raise LlmchatError(f"cannot write {target}: {err.strerror or err}") from err
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp_name, _file_mode(target))
        os.replace(temp_name, target)
    except OSError as err:
        _remove_quietly(temp_name)
        raise LlmchatError(f"cannot write {target}: {err.strerror or err}") from err
    except BaseException:
        _remove_quietly(temp_name)
        raise


def _file_mode(target: Path) -> int:
    """Keep an existing file's mode (the user chose it); a new export holds a conversation, so it
    is 0600 like the history it came from (mkstemp creates the temp file 0600 already)."""
    from llmchat.private_files import PRIVATE_FILE_MODE

    try:
        return target.stat().st_mode & 0o7777
    except OSError:
        return PRIVATE_FILE_MODE


def _remove_quietly(name: str) -> None:
    import os

    try:
        os.unlink(name)
    except OSError:
        pass


def rm_command(
    ref: Optional[str] = typer.Argument(
        None, metavar="[ID]", help="Conversation id, unique id prefix, name, or 'last'."
    ),
    everything: bool = typer.Option(
        False,
        "--all",
        help="Delete every conversation, the input history, the KV cache on disk, MCP images and the /copy file.",
    ),
    yes: bool = typer.Option(False, "--yes", "-y", help="Delete without asking."),
) -> None:
    """Delete a conversation with every copy of it: its messages, the lines typed for it in the
    input history, its KV cache on disk, the MCP images it alone holds, the /copy file of its
    text. Deleted text is overwritten, not left in the database."""
    from llmchat.errors import UsageError

    if everything == (ref is not None):
        raise UsageError("give a conversation ID or --all (not both); see `llmchat history list`")
    if everything:
        _remove_everything(yes)
        return
    assert ref is not None
    store = _open_store(reading=False)
    if store is None:
        raise _no_history_error(ref)
    with store:
        conv = store.get(ref)
        if not yes and not _confirm_delete(conv):
            typer.echo("Not deleted.", file=current_environment().stdout)
            return
        # Delete by the resolved full id: "last" may name another conversation by now.
        wal_cleared = store.delete(conv.id)
    _remove_copies(
        conv.id, {m.typed if m.typed is not None else m.content for m in conv.messages if m.role == "user"}, wal_cleared
    )
    _remove_copied_text([m.content for m in conv.messages if m.role == "assistant"])
    typer.echo(f"Deleted conversation {conv.id}.", file=current_environment().stdout)


def _remove_everything(yes: bool) -> None:
    import contextlib

    store = _open_store(reading=False)
    with store if store is not None else contextlib.nullcontext():
        count = 0 if store is None else len(store.list_conversations(limit=-1))  # -1: no limit
        if not yes and not _confirm_delete_all(count):
            typer.echo("Not deleted.", file=current_environment().stdout)
            return
        wal_cleared = store.delete_all() if store is not None else True
    _remove_copies(None, set(), wal_cleared)
    typer.echo(f"Deleted all {count} conversations.", file=current_environment().stdout)


def _confirm_delete_all(count: int) -> bool:
    from llmchat.errors import UsageError

    if not current_environment().stdin_isatty:
        raise UsageError(f"refusing to delete all {count} conversations without confirmation; pass --yes")
    return _confirm(f"Delete all {count} conversations, the input history and the caches that hold them?")


def _remove_copies(conversation_id: Optional[str], typed: set[str], wal_cleared: bool) -> None:
    """The other copies of one conversation (None: of all): its KV cache on disk (None: the whole
    disk cache, batch items' included), its lines in the input history; for all, the MCP media
    folder too (one conversation's images went with its messages: llmchat.store.media_files)."""
    from llmchat.engine import kv_store
    from llmchat.output import notice
    from llmchat.store.typed_lines import forget_typed_lines

    if conversation_id is None:
        from llmchat import paths
        from llmchat.store import media_files

        kv_store.clear(current_environment().kv_cache_dir)
        media_files.clear(paths.mcp_media_dir())  # `mcp call`'s and batch's images included
    else:
        kv_store.remove_for_conversation(conversation_id, folder=current_environment().kv_cache_dir)
    input_history = current_environment().input_history_file
    try:
        if conversation_id is None:
            from llmchat.ui.clipboard import clipboard_file

            input_history.unlink(missing_ok=True)
            clipboard_file().unlink(missing_ok=True)  # the last /copy where OSC 52 could not go
        else:  # its messages, and its commands (/system ..., /file PATH) by their tags
            forget_typed_lines(input_history, typed, conversation_id)
    except OSError as err:  # the conversation itself is gone: say what is left, do not fail
        notice(f"llmchat: warning: could not clear the input history {input_history} ({err.strerror or err})")
    if not wal_cleared:
        notice(
            "llmchat: another llmchat has the history open; the deleted text leaves the database's "
            "write-ahead log (history.db-wal) when it closes"
        )


def _remove_copied_text(replies: list[str]) -> None:
    """The /copy file (llmchat.ui.clipboard) goes when what it holds came from one of these
    replies: a reply, or a code block of one."""
    from llmchat.ui.clipboard import clipboard_file, code_blocks

    target = clipboard_file()
    try:
        copied = target.read_text(encoding="utf-8")
        if copied and any(copied in reply or copied in code_blocks(reply) for reply in replies):
            target.unlink()
    except (OSError, UnicodeDecodeError):  # none, or not ours to read: nothing of this conversation
        return


def _confirm_delete(conv) -> bool:
    from llmchat.errors import UsageError

    label = f"{conv.id}" + (f" ({conv.name})" if conv.name else "")
    if not current_environment().stdin_isatty:
        raise UsageError(f"refusing to delete conversation {label} without confirmation; pass --yes")
    return _confirm(f"Delete conversation {label} with {len(conv.messages)} messages?")


def _confirm(question: str) -> bool:
    try:
        return typer.confirm(question, default=False)
    except typer.Abort:  # Ctrl-D / Ctrl-C at the prompt means no
        return False
