"""The options of a model run (`ask`, `chat`, `batch`, `bench`), as one value.

`RunOptions` is what loading, the session and batch read; how the command line declares these
options (flags, help, panels) is `llmchat.commands.model_options`, so this module, which the lower
layers import, knows nothing of Typer.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from llmchat.defaults import DEFAULT_BATCH_SIZE, DEFAULT_CTX_CHECKPOINTS, DEFAULT_CTX_CHECKPOINTS_MIB


@dataclass(frozen=True)
class RunOptions:
    model: Optional[str] = None
    template: Optional[str] = None
    ctx: Optional[int] = None
    threads: Optional[int] = None
    batch_size: int = DEFAULT_BATCH_SIZE
    device: str = "auto"
    gpu_layers: Optional[int] = None
    flash_attn: Optional[str] = None  # auto | on | off; None: the config's flash_attn, else auto
    no_flash_attn: bool = False  # --no-flash-attn: the older spelling of --flash-attn off
    prompt_cache: bool = True  # --no-prompt-cache: neither read nor write the KV cache on disk
    kv_type: str = "f16"
    mmap: bool = True
    mlock: bool = False
    lookup: bool = False
    parallel: int = 1  # batch --parallel: sequences decoded together (flash attention auto: on above 1)
    kv_shift: bool = True
    ctx_checkpoints: int = DEFAULT_CTX_CHECKPOINTS  # recurrent and hybrid models (llmchat.engine.checkpoints)
    ctx_checkpoints_mib: int = DEFAULT_CTX_CHECKPOINTS_MIB
    draft_model: Optional[Path] = None
    mmproj: Optional[Path] = None  # the multimodal projector (llmchat.media.projector); None: found beside the model
    server: tuple[str, ...] = ()  # llama-server or OpenAI-compatible URLs (llmchat.engine.remote), in order
    connect_timeout: Optional[float] = None  # seconds; None: the server's config, else 10
    read_timeout: Optional[float] = None  # seconds between two chunks; None: the config, else 600
    verbose: bool = False
    debug: bool = False
    # sampling
    saved_prompt: Optional[str] = None  # -p NAME: a saved prompt, [prompts.NAME] (llmchat.startup.saved_prompts)
    system: Optional[str] = None
    preset: Optional[str] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    repeat_penalty: Optional[float] = None
    max_tokens: Optional[int] = None
    seed: Optional[int] = None
    stop: tuple[str, ...] = ()
    loop_stop: bool = True
    # reasoning models (llmchat.reasoning.formats)
    think: Optional[bool] = None
    reasoning_effort: Optional[str] = None
    thinking_budget: Optional[int] = None
    template_var: tuple[str, ...] = ()
    hide_thinking: bool = False
    reasoning_preserve: Optional[bool] = None  # None: the config's
    show_thinking: bool = False
    # structured output (llmchat.turn.structured)
    schema: Optional[str] = None
    schema_multi: bool = False
    output_format: Optional[str] = None
    grammar_file: Optional[Path] = None
    # Not a flag: which values a saved prompt filled in, as (name, "prompt NAME"), for /show.
    origins: tuple[tuple[str, str], ...] = ()
    # Not a flag: with several servers, connect to every one (batch spreads its items over them);
    # off, the first that answers is used (ask, chat).
    every_server: bool = False
