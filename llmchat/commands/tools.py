"""`llmchat tools list`: every tool the model could be offered, with its source and schema, and
what each costs in prompt tokens as the model's template renders it (llmchat.tools.token_cost):
-m names the model (default: the default model), whose tokenizer alone is loaded.

With no selection it lists everything the config defines ([tools.NAME] commands and every
[mcp.NAME] server's tools, which means starting those servers); with -T, --functions or --mcp it
lists exactly that selection, as ask/chat will offer it. Only typer is imported at module level.
(No `from __future__ import annotations`: Typer reads the annotations at run time.)
"""

from typing import TYPE_CHECKING, Any, List, Optional

import typer

if TYPE_CHECKING:
    from llmchat.config import Config

TOOL_HELP = (
    "A [tools.NAME] from the config, mcp:SERVER for every tool of an [mcp.SERVER], or (as --tools NAME,NAME) "
    "the names or globs (everything_get-*) of the offered tools to keep, leaving out the others (repeatable)."
)
FUNCTIONS_HELP = (
    "A Python file whose public functions become tools. This imports and runs that file: use your own code."
)
MCP_HELP = (
    'An MCP server: a command to start over stdio, e.g. --mcp "mcp-server-time --local-timezone UTC", '
    "or an http:// URL (Streamable HTTP; NAME=URL names it) (repeatable)."
)


COUNT_MODEL_HELP = (
    "The model whose template and tokenizer count each tool's tokens (only its vocabulary is loaded). "
    "Default: the default model."
)
ROOT_HELP = (
    "A folder MCP servers may work in (repeatable): the client's roots, which servers read with roots/list, "
    "with each server's own roots = [...]. None given: none declared (a server works where its command line says)."
)


def list_command(
    tool: Optional[List[str]] = typer.Option(None, "-T", "--tool", "--tools", help=TOOL_HELP),
    functions: Optional[List[str]] = typer.Option(None, "--functions", help=FUNCTIONS_HELP),
    mcp: Optional[List[str]] = typer.Option(None, "--mcp", help=MCP_HELP),
    root: Optional[List[str]] = typer.Option(None, "--root", metavar="DIR", help=ROOT_HELP),
    model: Optional[str] = typer.Option(None, "-m", "--model", help=COUNT_MODEL_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list: name, source, description, parameters."),
) -> None:
    """Show each tool: name, source, description, argument schema, and its tokens in the prompt."""
    import json

    from llmchat.env import current_environment
    from llmchat.tools.describe import cost_lines, describe_parameters
    from llmchat.tools.mcp.roots import use_roots
    from llmchat.tools.registry import gather_tools, is_pick, split_names

    use_roots(root)  # a --root that is not a folder: exit 2
    env = current_environment()
    config = env.config
    # Picks alone (--tools NAME) choose among everything configured.
    selected = bool(functions or mcp or any(not is_pick(name, config) for name in split_names(tool or ())))
    with gather_tools(config, tool or (), functions or (), mcp or (), everything_configured=not selected) as toolset:
        specs = toolset.specs()
    costs = counted_costs(specs, model, env) if specs else None
    if as_json:
        entries = [
            {
                "name": spec.name,
                "source": spec.source,
                "description": spec.description,
                "parameters": spec.parameters,
                "approve": spec.approve,
                "tokens": costs.tokens[spec.name] if costs is not None else None,
            }
            for spec in specs
        ]
        env.stdout.write(json.dumps(entries, indent=2, ensure_ascii=False) + "\n")
        return
    if not specs:
        env.stderr.write(
            "llmchat: no tools: add [tools.NAME] or [mcp.NAME] to the config (llmchat config path), "
            "or give --functions FILE.py or --mcp COMMAND\n"
        )
        return
    # The tools' names, descriptions and arguments are a server's, a file's: terminal-safe on a terminal.
    for number, spec in enumerate(specs):
        if number:
            env.write_out("\n")
        env.write_out(f"{spec.name}  ({spec.source}{', runs without asking' if spec.approve == 'always' else ''})\n")
        if spec.description:
            for line in spec.description.strip().splitlines():
                env.write_out(f"  {line}\n")
        env.write_out("  arguments:" + ("" if spec.parameters.get("properties") else " none") + "\n")
        for line in describe_parameters(spec.parameters):
            env.write_out(f"    {line}\n")
    if costs is not None:
        env.write_out("\n")
        for line in cost_lines(costs):
            env.write_out(line + "\n")


def counted_costs(specs: List[Any], model: Optional[str], env: Any) -> Optional[Any]:
    """The tools' ToolCosts, counted with the model's template and tokenizer; None, with a line on
    stderr, where no model can count them (none given and no default installed, or a bad file)."""
    from llmchat.errors import LlmchatError

    try:
        return tool_costs(specs, model, env.config)
    except (LlmchatError, ValueError) as err:
        env.write_err(f"llmchat: tokens not counted: {err}\n")
        return None


def tool_costs(specs: List[Any], model: Optional[str], config: "Config") -> Any:
    """Each tool's tokens with -m's template (the config's template for it, else the model's own),
    tokenized by its vocabulary alone. The share is of the context the chat would open: the
    config's ctx, else min(trained context, the default maximum)."""
    from llmchat.defaults import DEFAULT_MAX_CTX
    from llmchat.models.resolve import resolve_model
    from llmchat.prompt.model_facts import facts_from_gguf
    from llmchat.prompt.resolution import resolve_template
    from llmchat.tools.families import detect_family
    from llmchat.tools.prompt import capabilities
    from llmchat.tools.token_cost import VocabTokenizer, measure, prompt_counter

    resolved = resolve_model(model, config)
    facts = facts_from_gguf(resolved.path)
    template = resolve_template(facts, None, resolved.template)
    family = detect_family(template.text)
    vocab = VocabTokenizer(resolved.path)
    try:
        count = prompt_counter(vocab.prompt_tokens, template, facts, family, capabilities(template.text, family))
        n_ctx = resolved.ctx or min(vocab.n_ctx_train or DEFAULT_MAX_CTX, DEFAULT_MAX_CTX)
        return measure(specs, count, n_ctx, f"{resolved.name}'s template ({template.source_detail})")
    finally:
        vocab.close()
