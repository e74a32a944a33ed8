"""The engine: the only package that speaks to llama.cpp (through llmchat.engine.bindings).

Everything else speaks to an engine through `llmchat.engine.interface` (load, tokenize, stream
tokens with timings) so that the rest of the tool does not depend on llama.cpp's API.
Importing this package is cheap: `Engine` and its kin load llama.cpp's bindings only when first
named, so a remote engine (llmchat.engine.remote) and the pure modules here (interface, driver,
reply, prompt_pieces) load neither.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llmchat.engine.core import Engine, Generation, TokenEvent
    from llmchat.engine.model_load import EngineSettings, physical_cores
    from llmchat.engine.reply import GenerationOutcome

__all__ = ["Engine", "EngineSettings", "Generation", "GenerationOutcome", "TokenEvent", "physical_cores"]


def __getattr__(name: str) -> Any:
    """`from llmchat.engine import Engine`: the local engine, loaded on first use (PEP 562)."""
    if name == "GenerationOutcome":
        from llmchat.engine.reply import GenerationOutcome

        return GenerationOutcome
    if name in ("EngineSettings", "physical_cores"):
        from llmchat.engine import model_load

        return getattr(model_load, name)
    if name in __all__:
        from llmchat.engine import core

        return getattr(core, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
