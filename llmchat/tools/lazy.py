"""Tools offered lazily: when their schemas would take more than a share of the context.

One MCP server can offer tens of thousands of tokens of tool schemas. Past `lazy_tools` (a share of
the context, the config's; default DEFAULT_SHARE) the model sees one tool in their place,
`load_tool`, whose description lists every tool's name and one-line description and whose one
argument is the name (an enum: the call grammar holds it to a real one). Calling it adds that
tool, schema and all, to the tools offered from the next round on (ToolOffer.load), where the
model calls it as any other.

The KV cache: the tool block is rendered before the conversation, so a load changes the prompt
from the end of that block on, once: the next round prefills from there, and every later round and
turn reuses the longer prefix (llmchat.turn.tool_loop keeps the reloaded prompt as its new prefix).
A loaded tool goes at the end of the block, so what came before it stays cached.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from llmchat.tools.spec import ToolSpec

DEFAULT_SHARE = 0.25  # a quarter of the context: the rest is the conversation's and the reply's
LOADER = "load_tool"
ONE_LINE_CHARS = 120  # of a tool's description in the loader's list


def loader_name(names: Sequence[str]) -> str:
    """The loader's name: `load_tool`, unless a tool of that name exists."""
    return LOADER if LOADER not in names else "llmchat_load_tool"


def one_line(description: str) -> str:
    """A tool's description as one line: its first line, up to its first sentence, cut to ONE_LINE_CHARS."""
    first = next((line.strip() for line in description.splitlines() if line.strip()), "")
    end = first.find(". ")
    if end > 0:
        first = first[: end + 1]
    return first if len(first) <= ONE_LINE_CHARS else first[: ONE_LINE_CHARS - 1] + "…"


def loader_spec(name: str, catalog: Sequence[ToolSpec], load: Callable[[str], str]) -> ToolSpec:
    """The one tool offered in place of `catalog`: it lists them, and loads the one named."""
    listing = "\n".join(f"- {spec.name}: {one_line(spec.description)}".rstrip(": ") for spec in catalog)
    description = (
        "Load one of these tools so that you can call it; after loading, it is among your tools with its "
        f"parameters. The tools:\n{listing}"
    )
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": {"name": {"type": "string", "enum": [spec.name for spec in catalog]}},
        "required": ["name"],
    }

    def run(arguments: dict[str, Any], timeout_s: float) -> str:
        return load(str(arguments.get("name", "")))

    # Loading runs nothing of the tool's: it needs no approval.
    return ToolSpec(name, description, parameters, "llmchat", run, approve="always")


def is_lazy(tool_tokens: int, n_ctx: int, share: float) -> bool:
    """Whether tools of `tool_tokens` are offered lazily in a context of `n_ctx` tokens (1: never)."""
    return share < 1 and tool_tokens > share * n_ctx
