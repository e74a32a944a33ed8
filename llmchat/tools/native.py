"""Tools through an OpenAI-compatible server's own `tools` parameter (vLLM, Ollama's /v1,
llama_cpp.server, llama-server spoken to as `kind = "openai"`).

Such a server renders its own chat template, so the call format is its business:
- the tools go in the request's `tools` (OpenAI entries), with a `tool_choice` per round
  (`round_choice`); earlier calls and results go back as assistant `tool_calls` messages
  (arguments as JSON text) and `tool` messages with their `tool_call_id` (`NATIVE` shapes them
  through llmchat.tools.prompt, as a family whose template takes the OpenAI shape as it is);
- the calls come back apart from the text, in the stream's `delta.tool_calls`, assembled by the
  engine (llmchat.engine.remote.openai_compat); `parsed_reply` makes them a round's calls, where a
  local model's come from parsing its text;
- no grammar is built or checked: the server holds its reply to the call format, or does not.
What stays llmchat's, as for a local model: the arguments are validated with jsonschema before
anything runs, approval, `--chain-limit`, errors as tool messages.

A server that ignores `tools` answers in text: the text is the answer, and when the call was
forced, one notice says the server may not support tools.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from llmchat.tools.call_parsers import ParsedCall, ParsedReply
from llmchat.tools.execute import parse_arguments
from llmchat.tools.families import Family
from llmchat.tools.prompt import Capabilities

if TYPE_CHECKING:
    from llmchat.engine.reply import ServerCall
    from llmchat.tools.choice import RoundPlan, ToolChoice

IGNORED_NOTICE = (
    "the server answered in text where a tool call was required: it may not support tools for this model "
    "(llama-server needs a chat template with a tool format); the text is the answer"
)
CUT_NOTICE = (
    "the reply reached its token limit before the required tool call (the server let text come first); "
    "the text is the answer: raise --max-tokens, or ask for the call in the prompt"
)


def _text_only(text: str, schemas: Mapping[str, Any] | None = None) -> ParsedReply:
    """The server's text is never a call: its calls come apart from it."""
    return ParsedReply(text)


# The server's template reads the OpenAI shape: the tool list as `tools`, a call's content None
# beside its `tool_calls`, arguments as JSON text.
NATIVE = Family("native", "the server's own (OpenAI tools)", (), (), _text_only, arguments_as_text=True)
CAPABILITIES = Capabilities(renders_tools=True, call_content=None)


def round_choice(choice: ToolChoice, plan: RoundPlan, final: bool) -> str | dict[str, Any]:
    """The `tool_choice` of a round: "none" once the chain limit is reached (the tools stay listed,
    so the prompt stays the same), the forced call of the first round, else "auto"."""
    if final:
        return "none"
    if not plan.forced:
        return "auto"
    if choice.mode == "named" and choice.name is not None:
        return {"type": "function", "function": {"name": choice.name}}
    return "required"


def missing_call_notice(finish_reason: str) -> str:
    """What to say once when a forced round brought no call back."""
    return CUT_NOTICE if finish_reason == "length" else IGNORED_NOTICE


def parsed_reply(text: str, calls: Sequence[ServerCall]) -> ParsedReply:
    """A round's reply: the server's text, and its calls with their arguments decoded where they
    are JSON (otherwise kept as sent, for the argument check to refuse with its reason)."""
    parsed = tuple(ParsedCall(call.name, parse_arguments(call.arguments)[0], call.id or None) for call in calls)
    return ParsedReply(text.strip() if parsed else text, parsed)
