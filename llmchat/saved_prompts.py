"""Saved prompts: `[prompts.NAME]` in the config, applied with `-p NAME` or `/prompt NAME`.

A saved prompt bundles what is otherwise retyped or kept in a shell alias: a system prompt and,
optionally, the model, template, sampling preset, sampling values and schema that go with it.

    [prompts.reviewer]
    system = "You review Python code. Be brief."
    model = "smollm2"          # a path, a models-folder name or an alias, as -m takes
    preset = "precise"
    temperature = 0.1          # any of: temperature top_p top_k min_p repeat_penalty max_tokens seed
    schema = "verdict, reasons list[str]"

Precedence: command-line flags > the saved prompt > the config's own defaults. Sampling values keep
their provenance ("prompt reviewer", "prompt reviewer preset precise"), so `/show` says where each
one came from, as it does for presets and flags.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmchat import paths
from llmchat.config import PROMPT_TEXT_KEYS, Config, check_saved_prompt
from llmchat.errors import UsageError
from llmchat.sampling import PRESETS, SETTABLE

if TYPE_CHECKING:
    from llmchat.options import RunOptions
    from llmchat.session import ChatSession


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
    if not opts.saved_prompt:
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
    if not prompt_name:
        return []
    prompt = lookup(prompt_name, config)
    layers: list[tuple[str, dict[str, Any], str | None]] = []
    if prompt.preset:
        layers.append((f"{prompt.source} preset {prompt.preset}", dict(PRESETS[prompt.preset]), prompt.preset))
    if prompt.sampling:
        layers.append((prompt.source, dict(prompt.sampling), None))
    return layers


def apply_to_session(session: ChatSession, name: str) -> list[str]:
    """`/prompt NAME` in chat: the saved prompt's system prompt, sampling and schema from the next
    message on. The model cannot change under a running chat: a different one is said, not loaded.
    Returns the lines to show."""
    config = session.config or Config(path=paths.config_file())  # a session built without a config: none saved
    prompt = lookup(name, config)
    said = []
    if prompt.schema is not None:  # first: a schema the engine refuses leaves everything as it was
        from llmchat.structured import structured_output

        session.hold_to(structured_output(schema=prompt.schema, named=config.schemas))
        session.set_origin("schema", prompt.source)
    if prompt.system is not None:
        session.with_system(prompt.system)
        session.set_origin("system", prompt.source)
        said.append("system prompt set")
    sampling = session.sampling
    for source, layer, layer_preset in sampling_layers(name, config):
        sources = dict(sampling.sources) | {key: source for key in layer}
        sampling = dataclasses.replace(sampling, **layer, preset=layer_preset or sampling.preset, sources=sources)
    if sampling is not session.sampling:
        session.set_sampling(sampling)
        said.append(
            "sampling: "
            + ", ".join(
                f"{k}={getattr(sampling, k)}"
                for k in SETTABLE
                if k in sampling.sources and sampling.sources[k].startswith(prompt.source)
            )
        )
    if prompt.model is not None and not _same_model(prompt.model, config, session):
        said.append(
            f"prompt {name} names the model {prompt.model}; this chat keeps {session.model_label} "
            f"(start llmchat chat -p {name} to use it)"
        )
    return [f"prompt {name}: {line}" for line in said] or [f"prompt {name} sets nothing more here"]


def _same_model(requested: str, config: Config, session: ChatSession) -> bool:
    from llmchat.models.resolve import resolve_model

    try:
        wanted = resolve_model(requested, config).path
        return Path(wanted).resolve() == Path(session.engine.info.model_path).resolve()
    except Exception:  # an unresolvable name is reported as "not this model"
        return False
