"""`/prompt NAME` in a running chat: a saved prompt (llmchat.startup.saved_prompts) applied to the session.

Its system prompt, sampling and schema hold from the next message on, each named as coming from
the prompt in `/show`. A prompt naming another model says so, with the `/model NAME` that loads
it, instead of loading it (a load takes seconds, and may fail); on a server, whose model the chat
cannot switch, it says that. Which model a prompt names is read as `-m` reads it: a path, name or
alias for a local model; a configured server's `NAME` or `NAME:MODEL`, or the served model's name,
on a server.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from llmchat import paths
from llmchat.config import Config
from llmchat.engine.sampling import SETTABLE
from llmchat.errors import LlmchatError
from llmchat.startup.saved_prompts import lookup, sampling_layers

if TYPE_CHECKING:
    from llmchat.turn.session import ChatSession


def apply_to_session(session: ChatSession, name: str) -> list[str]:
    """`/prompt NAME` in chat: the saved prompt's system prompt, sampling and schema from the next
    message on. The model cannot change under a running chat: a different one is said, not loaded.
    Returns the lines to show."""
    config = session.config or Config(path=paths.config_file())  # a session built without a config: none saved
    prompt = lookup(name, config)
    said = []
    if prompt.schema is not None:  # first: a schema the engine refuses leaves everything as it was
        from llmchat.turn.structured import structured_output

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
        said.append(f"prompt {name} names the model {prompt.model}; " + _how_to_use(prompt.model, name, session))
    return [f"prompt {name}: {line}" for line in said] or [f"prompt {name} sets nothing more here"]


def _how_to_use(model: str, name: str, session: ChatSession) -> str:
    if session.engine.caps.remote:
        where = f"this chat runs on a server ({session.model_label}), whose model /model cannot switch"
    elif session.model_loader is None:  # a session built without one (embedding llmchat)
        where = f"this chat keeps {session.model_label}"
    else:
        return f"this chat is on {session.model_label}: /model {model} switches to it"
    return f"{where} (start llmchat chat -p {name} to use it)"


def _same_model(requested: str, config: Config, session: ChatSession) -> bool:
    """Whether `requested` (a saved prompt's `model`) names the model answering now."""
    if requested == session.model_label:
        return True
    if session.engine.caps.remote:
        return _names_this_server(requested, config, session.model_label)
    from llmchat.models.resolve import resolve_model

    try:
        wanted = resolve_model(requested, config).path
        return Path(wanted).resolve() == Path(session.engine.info.model_path).resolve()
    except Exception:  # an unresolvable name is reported as "not this model"
        return False


def _names_this_server(requested: str, config: Config, label: str) -> bool:
    """On a server, the model is what the chat was started with: a configured server's `NAME` or
    `NAME:MODEL` names it where it gives the same label (llmchat.startup.loading.server_label); a model's
    own name was compared with the label already."""
    from llmchat.options import RunOptions
    from llmchat.startup.loading import server_label, server_specs

    try:
        specs = server_specs(RunOptions(model=requested), config)
    except LlmchatError:  # its key's variable unset, ...: not a server this chat could be on
        return False
    return bool(specs) and server_label(specs[0]) == label
