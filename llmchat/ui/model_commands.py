"""Slash commands for the chat's model: /model [NAME] and /models.

`/model NAME` switches the model in the same conversation (`ChatSession.switch_model`, which owns
the swap: llmchat.turn.model_switch). NAME is what `-m` takes: a name `llmchat models list` shows, an
alias, a store name or a .gguf path. A model that cannot load leaves the chat on the current one,
with one line saying why. The new model's recommended sampling (`general.sampling.*`) replaces the
old one's where the user set nothing, and one line says which values moved. `/model` alone says which model answers; `/models` lists the ones that
can.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from llmchat import interrupts
from llmchat.engine.sampling import SETTABLE
from llmchat.errors import LlmchatError
from llmchat.ui.context import CONTINUE, CommandContext, Outcome

if TYPE_CHECKING:
    from llmchat.config import Config
    from llmchat.engine.sampling import SamplingParams
    from llmchat.models.catalogue import Entry
    from llmchat.turn.session import ChatSession


def cmd_model(ctx: CommandContext, arg: str) -> Outcome:
    session = ctx.session
    if not arg:
        ctx.out.print(current_model(session), markup=False, highlight=False)
        return CONTINUE
    was, sampling = session.model_label, session.sampling
    try:
        session.switch_model(arg, ctx.error)
    except LlmchatError as err:
        ctx.error(f"error: {err}; still on {was}")
        return CONTINUE
    except KeyboardInterrupt:  # Ctrl-C during the load stops it (llmchat.interrupts)
        interrupts.consume()
        ctx.error(f"model load interrupted; still on {was}")
        return CONTINUE
    turns = sum(1 for message in session.conversation.messages if message["role"] == "user")
    count = f"{turns} turn" + ("" if turns == 1 else "s")
    ctx.info(f"{current_model(session)}; the conversation goes on ({count}, its prompt built anew)")
    changed = sampling_changes(sampling, session.sampling)
    if changed:
        ctx.info(f"sampling for {session.model_label}: {changed}; what you set yourself stays (/show)")
    return CONTINUE


def sampling_changes(before: SamplingParams, after: SamplingParams) -> str:
    """`temperature 0.3 -> 0.6 (model), top_k 20 -> 40 (default)`: the values a switch moved to
    the new model's recommendation, or back to ours where it recommends none."""
    return ", ".join(
        f"{name} {getattr(before, name)} -> {getattr(after, name)} ({after.source_of(name)})"
        for name in SETTABLE
        if getattr(before, name) != getattr(after, name)
    )


def current_model(session: ChatSession) -> str:
    """`NAME · template T (source) · ctx N · PATH`: the model answering now."""
    template = session.template
    source = f" ({template.source})" if template.source not in ("", template.name) else ""
    return (
        f"{session.model_label} · template {template.name}{source} · ctx {session.engine.n_ctx:,}"
        f" · {session.engine.info.model_path}"
    )


def cmd_models(ctx: CommandContext, arg: str) -> Outcome:
    from rich.table import Table

    session = ctx.session
    entries = runnable_models(session.config)
    if not entries:
        ctx.error("no other models found; download one with: llmchat models pull hf:ORG/REPO")
        return CONTINUE
    current = os.path.realpath(session.engine.info.model_path)
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("", "name (/model NAME)", "kind", "arch", "quant", "ctx", "template", "fits"):
        table.add_column(column, no_wrap=column.startswith("name"))
    for entry in entries:
        summary = entry.summary
        table.add_row(
            "*" if os.path.realpath(entry.candidate.path) == current else "",
            entry.shown_name,
            entry.kind.label,
            summary.architecture or "?",
            summary.quantization or "?",
            f"{summary.trained_context:,}" if summary.trained_context else "?",
            "yes" if summary.has_template else "built-in",
            entry.fits,
        )
    ctx.out.print(table, markup=False, highlight=False)
    if session.model_loader is None:
        ctx.error("this chat runs on a server: /model cannot switch it")
    return CONTINUE


def runnable_models(config: Config | None) -> list[Entry]:
    """The models `llmchat models list` shows as runnable (llmchat.models.catalogue)."""
    from llmchat.models.catalogue import catalogue

    return [entry for entry in catalogue(config) if entry.runnable]


def model_names(config: Config | None) -> list[tuple[str, str]]:
    """(name, description) for completing /model: every runnable model by the name `models list`
    shows, then the config's aliases."""
    found = [
        (entry.shown_name, f"{entry.kind.label} · {entry.summary.quantization or '?'}")
        for entry in runnable_models(config)
    ]
    aliases = sorted(config.models) if config is not None else []
    return found + [(alias, "alias") for alias in aliases if alias not in dict(found)]
