"""Search results on a screen or a pipe (`llmchat history search`, /search), and /search itself.

A result is one row: the conversation (id, and name when it has one), the turn (1-based, as
`history fork --at` and /branch count), the role, and a snippet whose matches are highlighted on
a terminal and marked **like this** where styles do not show (a pipe, a file). /load ID opens
a result's conversation (llmchat.ui.conversation_commands.cmd_load).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmchat.errors import UsageError
from llmchat.ui.context import CONTINUE, HISTORY_OFF, CommandContext, Outcome

if TYPE_CHECKING:
    from rich.table import Table
    from rich.text import Text

    from llmchat.store.search import SearchHit

MATCH_STYLE = "bold magenta"
PLAIN_MARK = "**"
SEARCH_LIMIT = 20


def snippet_text(hit: SearchHit, styled: bool) -> Text:
    """The snippet with its matches in MATCH_STYLE (styled) or between ** marks."""
    from rich.text import Text

    if not styled:
        return Text(hit.marked(PLAIN_MARK, PLAIN_MARK))
    text = Text()
    # With both marks the same, the pieces alternate: between matches, a match, between, ...
    for number, piece in enumerate(hit.marked("\0", "\0").split("\0")):
        text.append(piece, style=MATCH_STYLE if number % 2 else "")
    return text


def results_table(hits: list[SearchHit], styled: bool) -> Table:
    """One row a match: ID, Name, Turn, Role, Match. Ids never wrap or clip (/load takes them)."""
    from rich.table import Table

    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("ID", no_wrap=True)
    named = any(hit.conversation_name for hit in hits)
    if named:
        table.add_column("Name", no_wrap=True, max_width=24, overflow="ellipsis")
    table.add_column("Turn", no_wrap=True, justify="right")
    table.add_column("Role", no_wrap=True)
    table.add_column("Match", overflow="fold")
    for hit in hits:
        name = [hit.conversation_name or ""] if named else []
        table.add_row(hit.conversation_id, *name, str(hit.turn), hit.role, snippet_text(hit, styled))
    return table


def cmd_search(ctx: CommandContext, arg: str) -> Outcome:
    """`/search TEXT`: the saved conversations' messages that match, best first."""
    store = ctx.session.history
    if store is None:
        ctx.error(HISTORY_OFF)
        return CONTINUE
    if not arg.strip():
        ctx.error('usage: /search TEXT (words, "a phrase", prefix*, OR, NOT)')
        return CONTINUE
    try:  # a locked or unreadable database is the chat loop's to say (HistoryError)
        hits = store.search(arg, SEARCH_LIMIT)
    except UsageError as err:  # a query FTS5 cannot parse
        ctx.error(f"error: {err}")
        return CONTINUE
    if not hits:
        ctx.info(f"no saved message matches {arg!r}")
        return CONTINUE
    ctx.out.print(results_table(hits, styled=ctx.out.is_terminal), markup=False, highlight=False)
    more = f"the best {SEARCH_LIMIT} · " if len(hits) == SEARCH_LIMIT else ""
    ctx.info(f"{more}/load ID opens a conversation")
    return CONTINUE
