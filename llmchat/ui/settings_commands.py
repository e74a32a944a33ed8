"""Slash commands that change or show how the chat answers: /system, /set, /think, /nothink,
/prompt, /show, /stats, /tools and /tool. Each changes the session through its own methods.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from llmchat.engine.sampling import PRESETS, SETTABLE, with_setting
from llmchat.errors import HistoryError, LlmchatError
from llmchat.ui.context import CONTINUE, CommandContext, Outcome, one_line

if TYPE_CHECKING:
    from llmchat.engine.sampling import SamplingParams

NO_TOOLS = "no tools in this chat; start it with -T NAME, --functions FILE.py or --mcp COMMAND"


def cmd_system(ctx: CommandContext, arg: str) -> Outcome:
    session = ctx.session
    if not arg:
        current = session.conversation.system
        if current:
            ctx.out.print(current, markup=False, highlight=False)
        else:
            ctx.info("no system prompt; set one with /system TEXT")
        return CONTINUE
    new = None if arg == "--clear" else arg
    try:
        session.with_system(new)
    except HistoryError as err:
        # with_system changes the conversation first, then the store: the chat keeps the new prompt.
        ctx.history_failed(err)
    ctx.info("system prompt cleared" if new is None else "system prompt set")
    return CONTINUE


def cmd_set(ctx: CommandContext, arg: str) -> Outcome:
    parts = arg.split(None, 1)
    if len(parts) != 2:
        ctx.error(f"usage: /set KEY VALUE, KEY one of: {', '.join(SETTABLE)}, preset")
        return CONTINUE
    key, value = parts[0].lower().replace("-", "_"), parts[1].strip()
    if key == "temp":
        key = "temperature"
    session = ctx.session
    try:
        session.set_sampling(with_setting(session.sampling, key, value))
    except LlmchatError as err:
        ctx.error(f"error: {err}")
        return CONTINUE
    if key == "preset":
        ctx.info(f"preset {value}: " + ", ".join(f"{k}={_value(session.sampling, k)}" for k in PRESETS[value]))
    else:
        ctx.info(f"{key} = {_value(session.sampling, key)}")
    return CONTINUE


def _value(sampling: SamplingParams, name: str) -> str:
    value = getattr(sampling, name)
    if value is None:
        from llmchat.turn.policy import DEFAULT_REPLY_CAP

        return {
            "seed": "random (a fresh seed per reply)",
            "max_tokens": f"{DEFAULT_REPLY_CAP} (the default reply cap; less when the context has less room)",
        }.get(name, "none")
    return f"{value:g}" if isinstance(value, float) else str(value)


def thinking(on: bool) -> Callable[[CommandContext, str], Outcome]:
    """/think (on) and /nothink (off): the template's thinking switch, from the next message."""

    def command(ctx: CommandContext, arg: str) -> Outcome:
        session = ctx.session
        if session.reasoning_format is None:
            ctx.error("this model's template has no thinking mode; /think and /nothink do nothing here")
            return CONTINUE
        said: list[str] = []
        session.set_thinking(on, said.append)
        for line in said:  # what the template cannot do (it has no switch), said once
            ctx.error(line)
        if not said:
            ctx.info(f"thinking {'on' if on else 'off'} from the next message")
        return CONTINUE

    return command


def cmd_prompt(ctx: CommandContext, arg: str) -> Outcome:
    from llmchat.ui.saved_prompt import apply_to_session

    if not arg:
        config = ctx.session.config
        known = ", ".join(sorted(config.prompts)) if config is not None and config.prompts else "none yet"
        ctx.error(f"usage: /prompt NAME (saved prompts: {known}; see llmchat prompts list)")
        return CONTINUE
    try:
        lines = apply_to_session(ctx.session, arg)
    except HistoryError as err:  # the system prompt is set; only its save failed
        ctx.history_failed(err)
        return CONTINUE
    except LlmchatError as err:
        ctx.error(f"error: {err}")
        return CONTINUE
    for line in lines:
        ctx.info(line)
    return CONTINUE


def cmd_show(ctx: CommandContext, arg: str) -> Outcome:
    from rich.table import Table

    if arg.strip().lower() == "tools":  # the last turn's tool calls in full
        from llmchat.ui.conversation_commands import cmd_show_tools

        return cmd_show_tools(ctx, arg)
    session = ctx.session
    template = session.template
    limit = session.engine.n_ctx
    used = session.context_used()
    budget = session.budget()
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    table.add_column(style="dim")
    info = session.engine.info
    origins = session.origins
    table.add_row("model", session.model_label, _with_origin(info.model_path, origins.get("model")))
    table.add_row("template", template.name, f"from {template.source_detail or template.source}")
    table.add_row(
        "context",
        f"{used:,} / {limit:,} tokens used",
        f"prompts up to {budget.prompt_limit:,}, {budget.reply_reserve:,} kept for the reply",
    )
    for row in info.rows:  # the engine's own: flash attention, threads, drafting; or the server's
        table.add_row(*row)
    if session.engine.caps.disk_cache:
        disk = session.kv_store
        table.add_row(
            "KV on disk",
            "on" if disk is not None else "off",
            f"{disk.folder}, at most {disk.max_bytes / 1024**3:.1f} GiB" if disk is not None else "",
        )
    system = session.conversation.system
    table.add_row("system", one_line(system) if system else "(none)", origins.get("system", ""))
    if origins.get("schema"):
        table.add_row("schema", "the reply is held to a schema", origins["schema"])
    count = f"{len(session.conversation.messages)} messages"
    fork = session.fork_from
    if session.history is None:
        saved = "not saved (history off)"
    elif session.conversation_id is None and fork is not None:
        saved = f"branch of {fork[0]}"
        count = f"shares turns 1..{fork[1]}; saved with its first reply; " + count
    elif session.conversation_id is None:
        saved = "not saved yet (saved after the first reply)"
    else:
        saved = session.conversation_id
    table.add_row("conversation", saved, count)
    sampling = session.sampling
    table.add_row("sampling", f"preset {sampling.preset}", "")
    for name in SETTABLE:
        table.add_row(f"  {name}", _value(sampling, name), sampling.source_of(name))
    if sampling.stop:
        table.add_row("  stop", ", ".join(repr(s) for s in sampling.stop), "flag")
    table.add_row("  loop stop", "on" if sampling.stop_loops else "off", "--no-loop-stop turns it off")
    ctx.out.print(table, markup=False, highlight=False)
    return CONTINUE


def _with_origin(detail: str, origin: str | None) -> str:
    return f"{detail} ({origin})" if origin else detail


def cmd_stats(ctx: CommandContext, arg: str) -> Outcome:
    from rich.table import Table

    result = ctx.session.last_result
    if result is None:
        ctx.info("no reply yet in this conversation")
        return CONTINUE
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(justify="right")
    for key, value in result.stats.to_dict().items():
        table.add_row(key, f"{value:g}" if isinstance(value, float) else str(value))
    table.add_row("seed", str(result.seed))
    ctx.out.print(table, highlight=False)
    return CONTINUE


def cmd_tools(ctx: CommandContext, arg: str) -> Outcome:
    """The tools offered to the model (-T, --functions, --mcp): name, source, arguments, and what
    each adds to the prompt in tokens (the same table as `llmchat tools list`)."""
    offer = ctx.session.tools
    if offer is None or not (offer.specs or offer.switched_off):
        ctx.error(NO_TOOLS)
        return CONTINUE
    from llmchat.tools.describe import describe_parameters

    state = "on" if offer.active else "off (/tool on offers them again)"
    ctx.out.print(f"tools {state}; call format: {offer.family.label}", markup=False, highlight=False)
    for spec in offer.listed():
        always = ", runs without asking" if spec.approve == "always" or spec.name in offer.policy.always else ""
        ctx.out.print(f"{spec.name}  ({spec.source}{always})", markup=False, highlight=False)
        if spec.description:
            ctx.out.print(f"  {spec.description.strip().splitlines()[0]}", markup=False, highlight=False)
        for line in describe_parameters(spec.parameters):
            ctx.out.print(f"    {line}", markup=False, highlight=False)
    if offer.switched_off:
        ctx.info(f"switched off: {', '.join(offer.switched_off)} (/tool on NAME offers one again)")
    if offer.specs:
        for line in session_cost_lines(ctx):
            ctx.out.print(line, markup=False, highlight=False)
    return CONTINUE


def session_cost_lines(ctx: CommandContext) -> list[str]:
    """The tools' token table, counted with the session's engine and template; one line saying why
    not where the engine takes messages (a server that renders the template itself)."""
    from llmchat.tools.describe import cost_lines
    from llmchat.tools.token_cost import measure, prompt_counter

    session = ctx.session
    offer = session.tools
    if offer is None or getattr(session, "engine", None) is None:
        return []  # no model to count with
    template = session.template
    count = prompt_counter(
        session.engine.prompt_tokens, template, session.facts, offer.family, offer.caps, dict(session.template_vars)
    )
    try:
        costs = measure(offer.listed(), count, session.engine.n_ctx, f"{session.model_label}'s template "
                        f"({template.source_detail})")  # fmt: skip
    except ValueError as err:
        return [f"tokens not counted: {err}"]
    return ["", *cost_lines(costs)]


def cmd_tool(ctx: CommandContext, arg: str) -> Outcome:
    """`/tool on|off`: offer the tools to the model from the next message, or not. `/tool on|off
    NAME...` (names or globs): switch those tools alone (the offer keeps them aside)."""
    offer = ctx.session.tools
    if offer is None or not (offer.specs or offer.switched_off):
        ctx.error(NO_TOOLS)
        return CONTINUE
    word, *names = arg.split() or [""]
    word = word.lower()
    if word not in ("on", "off"):
        ctx.error("/tool on or /tool off")
        return CONTINUE
    if not names:
        ctx.session.offer_tools(word == "on")
        ctx.info(f"tools {word} from the next message")
        return CONTINUE
    try:
        switched = offer.switch(names, word == "on")
    except LlmchatError as err:
        ctx.error(f"error: {err}")
        return CONTINUE
    already = "" if switched else f" (already {word})"
    ctx.info(f"{', '.join(switched) or ' '.join(names)} {word} from the next message{already}")
    return CONTINUE
