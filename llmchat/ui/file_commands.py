"""Slash commands for the files that go with the next message: /file, /files and /drop.

`/file mcp:SERVER/URI` attaches an MCP resource the same way (llmchat.tools.mcp.sources). The files wait
in `CommandContext.attachments` (the chat's own state, not the session's) until a
message is sent with them.
"""

from __future__ import annotations

from llmchat.errors import LlmchatError
from llmchat.ui.context import CONTINUE, CommandContext, Outcome


def cmd_file(ctx: CommandContext, arg: str) -> Outcome:
    from llmchat.edges.bounded_input import text_bound
    from llmchat.turn.attachments import collect, count_line
    from llmchat.turn.room import check_room

    if not arg:
        ctx.error("usage: /file PATH (a file, a glob, a folder or mcp:SERVER/URI; Tab completes them)")
        return CONTINUE
    try:
        resources = ctx.mcp.resource_bytes if ctx.mcp is not None else None
        bound = text_bound(ctx.session.engine.n_ctx)  # no more than the context could hold is read
        found = [
            a for a in collect([arg], resources=resources, bound=bound, skipped=ctx.info) if a not in ctx.attachments
        ]
        # The room counts the files already pending: together they must fit.
        checked = check_room(ctx.session, [*ctx.attachments, *found])
    except LlmchatError as err:
        ctx.error(f"error: {err}")
        return CONTINUE
    ctx.attachments.extend(found)
    for attachment, count in zip(found, checked.counts[-len(found) :] if found else []):
        ctx.info(count_line(attachment, count, ctx.session.engine.n_ctx))
    if found:
        ctx.info("attached to your next message (/files lists them, /drop removes them)")
        if checked.note:
            ctx.info(checked.note)
    return CONTINUE


def cmd_files(ctx: CommandContext, arg: str) -> Outcome:
    from llmchat.turn.attachments import count_line, tokens_of

    if not ctx.attachments:
        ctx.info("no files attached; /file PATH attaches one to the next message")
        return CONTINUE
    for attachment in ctx.attachments:
        tokens, _ = tokens_of(ctx.session, attachment)
        ctx.out.print(count_line(attachment, tokens, ctx.session.engine.n_ctx), markup=False, highlight=False)
    return CONTINUE


def cmd_drop(ctx: CommandContext, arg: str) -> Outcome:
    if not ctx.attachments:
        ctx.info("no files attached")
        return CONTINUE
    if not arg:
        dropped = [a.path for a in ctx.attachments]
        ctx.attachments.clear()
    else:
        dropped = [a.path for a in ctx.attachments if a.path == arg]
        if not dropped:
            ctx.error(f"{arg} is not attached; /files lists what is")
            return CONTINUE
        ctx.attachments[:] = [a for a in ctx.attachments if a.path != arg]
    ctx.info("dropped " + ", ".join(dropped))
    return CONTINUE
