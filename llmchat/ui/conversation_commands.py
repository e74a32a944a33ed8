"""Slash commands that act on the conversation and its place in the history: /clear, /undo,
/retry, /edit, /branch, /compact, /save, /load, /history, and /show tools (the last turn's tool
calls).

/undo, /retry and /edit find the last exchange as `Conversation` does (the last user message and
everything after it), so they work the same after a plain turn, a tool turn, a turn with files
and an interrupted one; the session drops it (`ChatSession.drop_last_exchange`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmchat.errors import HistoryError, LlmchatError
from llmchat.ui.context import CONTINUE, HISTORY_OFF, Action, CommandContext, Outcome, one_line

if TYPE_CHECKING:
    from llmchat.store.attachment_records import Attachment


def cmd_clear(ctx: CommandContext, arg: str) -> Outcome:
    ctx.session.new_conversation()
    ctx.info("new conversation (the system prompt and settings are kept)")
    return CONTINUE


def _drop_last_exchange(ctx: CommandContext) -> tuple[str, tuple[Attachment, ...]] | None:
    """Remove the last exchange from the conversation and the history. Returns the user message as
    typed and the files it carried, or None when there was nothing."""
    from llmchat.turn.branches import last_user_turn

    session = ctx.session
    start = session.conversation.last_exchange_start()
    if start is None:
        return None
    try:
        last = last_user_turn(session)
    except HistoryError:  # its files could not be looked up: the message as it was sent
        last = None
    typed, files = last or (session.conversation.messages[start]["content"], ())
    try:
        session.drop_last_exchange()
    except HistoryError as err:  # gone from the conversation; only the store failed
        ctx.history_failed(err)
    return typed, files


def cmd_undo(ctx: CommandContext, arg: str) -> Outcome:
    dropped = _drop_last_exchange(ctx)
    if dropped is None:
        ctx.error("nothing to undo")
    else:
        ctx.info(f"removed the last exchange ({one_line(dropped[0], 50)!r} and its reply)")
    return CONTINUE


def cmd_retry(ctx: CommandContext, arg: str) -> Outcome:
    """The last message sent again, with the files it carried (files attached since wait for the next)."""
    dropped = _drop_last_exchange(ctx)
    if dropped is None:
        ctx.error("nothing to retry: send a message first")
        return CONTINUE
    typed, files = dropped
    return Outcome(Action.TURN, typed, attachments=files)


def cmd_edit(ctx: CommandContext, arg: str) -> Outcome:
    """The last message back at the prompt, with its files pending again; the stored conversation
    keeps the old exchange, and sending starts a branch."""
    from llmchat.turn.branches import last_user_turn, turn_starts

    session = ctx.session
    try:
        last = last_user_turn(session)
    except HistoryError as err:
        ctx.error(f"error: {err}")
        return CONTINUE
    if last is None:
        ctx.error("nothing to edit: send a message first")
        return CONTINUE
    typed, files = last
    turns = len(turn_starts(session.conversation))
    saved = session.conversation_id or (session.fork_from or (None,))[0]
    session.drop_last_exchange(keep_in_history=True)
    ctx.attachments[:] = list(files)  # the files it carried go with the edited message
    if saved is not None and session.history is not None:
        ctx.info(
            f"editing turn {turns}: the old exchange stays in {saved}; sending starts a branch at turn {turns - 1}"
        )
    else:
        ctx.info(f"editing turn {turns}")
    return Outcome(Action.EDIT, typed)


def cmd_branch(ctx: CommandContext, arg: str) -> Outcome:
    from llmchat.turn.branches import turn_starts

    session = ctx.session
    turns = len(turn_starts(session.conversation))
    try:
        at = int(arg) if arg else turns
    except ValueError:
        ctx.error(f"usage: /branch [N], N a turn number 0..{turns}, got {arg!r}")
        return CONTINUE
    if not 0 <= at <= turns:
        ctx.error(f"this conversation has {turns} turns; /branch N takes 0..{turns}")
        return CONTINUE
    parent = session.conversation_id or (session.fork_from or (None,))[0]
    session.keep_turns(at)
    if parent is not None and session.history is not None:
        ctx.info(f"new branch of {parent} sharing turns 1..{at}; it is saved with its first reply")
    else:
        ctx.info(f"kept turns 1..{at}; the rest is dropped (history is off, so nothing else keeps it)")
    return CONTINUE


def cmd_compact(ctx: CommandContext, arg: str) -> Outcome:
    """/compact [INSTRUCTIONS]: the model summarises the older exchanges, and the summary takes
    their place in its context (llmchat.turn.compaction); the history keeps every message. A
    Ctrl-C while it writes stops it with nothing changed."""
    import sys

    from llmchat import interrupts
    from llmchat.turn.compaction import compact_now
    from llmchat.ui.terminal import quiet_terminal

    try:
        with interrupts.FirstCtrlCOnly(), quiet_terminal(sys.stdin):
            compaction = compact_now(ctx.session, arg or None)
    except KeyboardInterrupt:
        interrupts.consume()
        ctx.info("compaction interrupted; nothing changed")
        return CONTINUE
    except LlmchatError as err:  # the engine or a server failed while it wrote
        ctx.error(f"error: {err}; nothing changed")
        return CONTINUE
    if compaction is None:
        ctx.error("nothing to compact: the model's context holds no exchange yet")
        return CONTINUE
    if compaction.failure is not None:
        ctx.error(f"{compaction.notice()}; nothing changed (the chat trims when it must, as before)")
    else:
        ctx.info(compaction.notice())
    for line in compaction.notices:  # a failed save: the history is off from now on
        ctx.error(line)
    return CONTINUE


def cmd_save(ctx: CommandContext, arg: str) -> Outcome:
    session = ctx.session
    store = session.history
    if store is None:
        ctx.error(HISTORY_OFF)
        return CONTINUE
    conversation_id = session.conversation_id
    if conversation_id is None:
        ctx.error("nothing saved yet: a conversation is stored after its first reply")
        return CONTINUE
    if not arg:
        ctx.info(
            f"this conversation is saved as {conversation_id} (each turn is saved as it ends); /save NAME names it"
        )
        return CONTINUE
    try:
        store.rename(conversation_id, arg)
    except HistoryError as err:  # the store failed: the history is off from now on (said once)
        ctx.history_failed(err)
        return CONTINUE
    except LlmchatError as err:  # the name is taken or reserved
        ctx.error(f"error: {err}")
        return CONTINUE
    ctx.info(f"saved as {arg!r} ({session.conversation_id}); /load {arg} continues it later")
    return CONTINUE


def cmd_load(ctx: CommandContext, arg: str) -> Outcome:
    session = ctx.session
    if session.history is None:
        ctx.error(HISTORY_OFF)
        return CONTINUE
    if not arg:
        ctx.error("usage: /load NAME|ID (see /history)")
        return CONTINUE
    try:
        stored = session.history.get(arg)
    except LlmchatError as err:
        ctx.error(f"error: {err}")
        return CONTINUE
    session.load_conversation(stored)
    label = f"{stored.name!r} ({stored.id})" if stored.name else stored.id
    ctx.info(f"loaded {label}: {len(session.conversation.messages)} messages")
    last_user = session.conversation.last_user_message()
    if last_user is not None:
        ctx.info(f"last message: {one_line(last_user, 60)!r}")
    return CONTINUE


def cmd_history(ctx: CommandContext, arg: str) -> Outcome:
    from rich.table import Table

    session = ctx.session
    if session.history is None:
        ctx.error(HISTORY_OFF)
        return CONTINUE
    try:
        limit = int(arg) if arg else 10
    except ValueError:
        ctx.error(f"usage: /history [N], N a number, got {arg!r}")
        return CONTINUE
    try:
        summaries = session.history.list_conversations(limit=max(limit, 1))
    except LlmchatError as err:
        ctx.error(f"error: {err}")
        return CONTINUE
    if not summaries:
        ctx.info("no saved conversations yet")
        return CONTINUE
    headers = ("", "ID", "Name", "Updated (UTC)", "Msgs")
    rows = [
        (
            "*" if s.id == session.conversation_id else "",
            s.id,
            s.name or "",
            s.updated_at[:16].replace("T", " "),
            str(s.n_messages),
        )
        for s in summaries
    ]
    # Ids are what /load takes: those columns never clip; only the preview gives way.
    fixed = sum(max(len(text) for text in column) for column in zip(headers, *rows)) + 2 * len(headers)
    room = ctx.out.width - fixed
    show_preview = room >= 12
    table = Table(box=None, header_style="bold", pad_edge=False)
    for header in headers:
        table.add_column(header, no_wrap=True, justify="right" if header == "Msgs" else "left")
    if show_preview:
        longest = max(len("First message"), *(len(s.preview) for s in summaries))
        table.add_column("First message", no_wrap=True, overflow="ellipsis", width=min(room, longest))
    for row, summary in zip(rows, summaries):
        table.add_row(*row, *([summary.preview] if show_preview else []))
    ctx.out.print(table, markup=False, highlight=False)
    marked = any(row[0] for row in rows)
    ctx.info(("* marks this conversation · " if marked else "") + "/load ID|NAME continues one")
    return CONTINUE


def cmd_show_tools(ctx: CommandContext, arg: str) -> Outcome:
    """`/show tools`: the last turn's tool calls in full: name, arguments, how it went, the result."""
    import json

    result = ctx.session.last_result
    calls = result.tool_calls if result is not None else []
    if not calls:
        ctx.info("the last turn called no tools" if result is not None else "no reply yet in this conversation")
        return CONTINUE
    for number, call in enumerate(calls, 1):
        if not call.approved:
            how = "refused"
        else:
            how = ("failed" if call.error is not None else "ran") + f" in {call.duration_s:.2f} s"
        text = call.text_for_model
        size = f"{len(text):,} chars, {len(text.splitlines()):,} lines"
        ctx.out.print(f"[{number}] {call.name} · {how} · result {size}", style="bold", markup=False, highlight=False)
        arguments = json.dumps(call.arguments, ensure_ascii=False, indent=2, sort_keys=True)
        # A tool's output may hold escape sequences: the chat's console shows them on a terminal
        # (llmchat.ui.safe_console), and a pipe gets the exact text.
        for block in ("arguments: " + arguments, text):
            ctx.out.print(block, markup=False, highlight=False)
    return CONTINUE
