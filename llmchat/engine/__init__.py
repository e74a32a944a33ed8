"""The engine: the only package that imports llama_cpp.

Everything else speaks to `Engine` (load, tokenize, stream tokens with timings) so that the rest
of the tool does not depend on llama-cpp-python's API, and importing llmchat stays cheap: this
package is imported only by commands that load a model.
"""

from llmchat.engine.core import Engine, EngineSettings, Generation, GenerationOutcome, TokenEvent, physical_cores

__all__ = ["Engine", "EngineSettings", "Generation", "GenerationOutcome", "TokenEvent", "physical_cores"]
