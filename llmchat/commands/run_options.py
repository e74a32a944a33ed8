"""A command's shared model options taken as one `RunOptions` (llmchat.options).

The half of llmchat.commands.model_options that needs no Typer: its `model_command` and a one-shot
`ask` parsed without Typer (llmchat.commands.quick_ask) both take the options here, so a flag means the same
either way. A saved prompt (`-p NAME`) fills what the flags left unset, from the config.
"""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Any, Iterable

from llmchat.options import RunOptions

if TYPE_CHECKING:
    from llmchat.config import Config

LISTS = ("stop", "template_var", "server")  # repeatable options: a list from the parser, a tuple in RunOptions


def option_defaults() -> dict[str, Any]:
    return {f.name: f.default for f in fields(RunOptions)}


def take_run_options(kwargs: dict[str, Any], shared: Iterable[str], config: Config) -> RunOptions:
    """Take the options named `shared` out of a command's arguments (`kwargs`, changed in place)
    as one RunOptions; those not given are RunOptions' defaults."""
    defaults = option_defaults()
    values = {name: kwargs.pop(name, None if name in LISTS else defaults[name]) for name in shared}
    for name in LISTS:
        values[name] = tuple(values.get(name) or ())
    opts = RunOptions(**values)
    if opts.saved_prompt:
        from llmchat.startup.saved_prompts import apply_to_options

        opts = apply_to_options(opts, config)
    return opts
