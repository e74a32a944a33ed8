"""Saved prompts: `[prompts.NAME]` in the config, applied with `-p NAME` or `/prompt NAME`.

A saved prompt bundles what is otherwise retyped or kept in a shell alias: a system prompt and,
optionally, the model, template, sampling preset, sampling values and schema that go with it.

    [prompts.reviewer]
    system = "You review Python code. Be brief."
    model = "smollm2"          # a path, a models-folder name or an alias, as -m takes
    preset = "precise"
    temperature = 0.1          # any of: temperature top_p top_k min_p repeat_penalty max_tokens seed
    schema = "verdict, reasons list[str]"

`-p mcp:SERVER/NAME` names an MCP server's prompt instead (llmchat.tools.mcp.sources): its messages open
the conversation, and it sets none of the values below.

Precedence: command-line flags > the saved prompt > the config's own defaults. Sampling values keep
their provenance ("prompt reviewer", "prompt reviewer preset precise"), so `/show` says where each
one came from, as it does for presets and flags.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmchat.config import PROMPT_TEXT_KEYS, Config, check_saved_prompt
from llmchat.engine.sampling import PRESETS
from llmchat.errors import UsageError
from llmchat.tools.mcp.sources import is_mcp_ref

if TYPE_CHECKING:
    from llmchat.options import RunOptions


@dataclass(frozen=True)
class SavedPrompt:
    name: str
    system: str | None = None
    model: str | None = None
    template: str | None = None
    preset: str | None = None
    schema: str | None = None
    description: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)  # validated values of SETTABLE keys

    @property
    def source(self) -> str:
        """How /show names this prompt as the origin of a value."""
        return f"prompt {self.name}"

    def summary(self) -> str:
        """One line for `prompts list`: what the prompt sets besides its system text."""
        parts = [f"{key} {getattr(self, key)}" for key in ("model", "preset", "template") if getattr(self, key)]
        parts += [f"{key}={value}" for key, value in self.sampling.items()]
        if self.schema:
            parts.append("schema")
        return ", ".join(parts)

    def as_table(self) -> dict[str, Any]:
        """The prompt as it would be written in the config (for `prompts show --json`)."""
        values = {key: getattr(self, key) for key in PROMPT_TEXT_KEYS if getattr(self, key) is not None}
        return {"name": self.name, **values, **self.sampling}


def parse(config_path: Path, name: str, settings: Any) -> SavedPrompt:
    values, sampling = check_saved_prompt(config_path, name, settings)
    return SavedPrompt(name=name, sampling=sampling, **values)


def lookup(name: str, config: Config) -> SavedPrompt:
    """The saved prompt NAME; a missing name is a usage error that lists the known ones."""
    table = config.prompts
    if name not in table:
        known = ", ".join(sorted(table)) if table else "none yet"
        raise UsageError(
            f"no saved prompt named {name!r} (known: {known}); add [prompts.{name}] to {config.path} "
            "or see llmchat prompts list"
        )
    return parse(config.path, name, table[name])


def all_prompts(config: Config) -> list[SavedPrompt]:
    return [parse(config.path, name, config.prompts[name]) for name in sorted(config.prompts)]


def apply_to_options(opts: RunOptions, config: Config) -> RunOptions:
    """`-p NAME`: fill what the command line left unset from the saved prompt. Sampling is not
    copied here: `loading` layers it with its provenance (`sampling_layers`)."""
    if not opts.saved_prompt or is_mcp_ref(opts.saved_prompt):
        return opts
    prompt = lookup(opts.saved_prompt, config)
    changes: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for key in ("system", "model", "template", "schema"):
        ours = getattr(prompt, key)
        if ours is not None and getattr(opts, key) is None:
            changes[key] = ours
            origins[key] = prompt.source
    return dataclasses.replace(opts, **changes, origins=tuple(origins.items()))


def sampling_layers(prompt_name: str | None, config: Config) -> list[tuple[str, dict[str, Any], str | None]]:
    """The saved prompt's sampling as layers for `build_sampling`: (source, values, preset name)."""
    if not prompt_name or is_mcp_ref(prompt_name):
        return []
    prompt = lookup(prompt_name, config)
    layers: list[tuple[str, dict[str, Any], str | None]] = []
    if prompt.preset:
        layers.append((f"{prompt.source} preset {prompt.preset}", dict(PRESETS[prompt.preset]), prompt.preset))
    if prompt.sampling:
        layers.append((prompt.source, dict(prompt.sampling), None))
    return layers
