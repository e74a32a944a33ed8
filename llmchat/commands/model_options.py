"""The options shared by every command that loads a model, declared once for the command line.

`@model_command` adds the engine and sampling options to a Typer command's signature and hands
the function one `RunOptions` value (llmchat.options, taken by llmchat.commands.run_options) and
the run's `Environment` (llmchat.env), so `ask`, `chat`, `batch` and `bench` accept the same flags
with the same help and validation.
(No `from __future__ import annotations`: Typer reads the annotations at run time.)
"""

import functools
import inspect
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer

from llmchat.commands.help_panels import (
    CONTEXT,
    ENGINE,
    FILES,
    OUTPUT,
    REASONING,
    SAMPLING,
    SERVERS,
    STRUCTURED,
)
from llmchat.commands.run_options import LISTS, option_defaults, take_run_options
from llmchat.defaults import DEFAULT_MAX_CTX
from llmchat.env import current_environment

_ENGINE_OPTIONS = {
    "model": Annotated[
        Optional[str],
        typer.Option(
            "--model",
            "-m",
            help="A .gguf path, a name in the models folder, or a config alias. Default: LLMCHAT_MODEL, the config, then the bundled SmolLM2.",
            rich_help_panel=ENGINE,
        ),
    ],
    "template": Annotated[
        Optional[str],
        typer.Option(
            "--template",
            help="Chat template: a built-in name (llmchat template list) or a .jinja path.",
            rich_help_panel=ENGINE,
        ),
    ],
    "ctx": Annotated[
        Optional[int],
        typer.Option(
            "--ctx",
            help=f"Context window in tokens. Default: min(trained context, {DEFAULT_MAX_CTX}).",
            rich_help_panel=ENGINE,
        ),
    ],
    "threads": Annotated[
        Optional[int],
        typer.Option(
            "--threads",
            "-t",
            help="CPU threads, fixed. Default: the cores the machine has to spare, tuned while decoding.",
            rich_help_panel=ENGINE,
        ),
    ],
    "batch_size": Annotated[
        int, typer.Option("--batch-size", help="Prompt tokens evaluated per llama.cpp batch.", rich_help_panel=ENGINE)
    ],
    "device": Annotated[
        str,
        typer.Option(
            "--device",
            help="auto | cpu | gpu. auto offloads every layer when llama.cpp was built with GPU support.",
            rich_help_panel=ENGINE,
        ),
    ],
    "gpu_layers": Annotated[
        Optional[int],
        typer.Option("--gpu-layers", help="Layers to offload to the GPU (-1 = all).", rich_help_panel=ENGINE),
    ],
    "flash_attn": Annotated[
        Optional[str],
        typer.Option(
            "--flash-attn",
            metavar="[auto|on|off]",
            help="Flash attention. Default: auto (config: flash_attn): on with a GPU, a quantized KV cache or drafting; on the CPU what `llmchat bench --calibrate` measured faster (on until measured). See docs/speed-and-memory.md, determinism.",
            show_default=False,
            rich_help_panel=ENGINE,
        ),
    ],
    "no_flash_attn": Annotated[
        bool,
        typer.Option("--no-flash-attn", help="Same as --flash-attn off.", hidden=True, rich_help_panel=ENGINE),
    ],
    "prompt_cache": Annotated[
        bool,
        typer.Option(
            "--prompt-cache/--no-prompt-cache",
            help="Save the KV cache to disk after a turn and restore it in a new process (ask -c, chat --resume, /load). Off with --no-history. Config: prompt_cache.",
            rich_help_panel=CONTEXT,
        ),
    ],
    "kv_type": Annotated[
        str,
        typer.Option(
            "--kv-type",
            help="KV cache type: f16 | q8_0 | q4_0 (quantized needs flash attention).",
            rich_help_panel=ENGINE,
        ),
    ],
    "mmap": Annotated[
        bool, typer.Option("--mmap/--no-mmap", help="Memory-map the model file.", rich_help_panel=ENGINE)
    ],
    "mlock": Annotated[bool, typer.Option("--mlock", help="Lock the model in RAM.", rich_help_panel=ENGINE)],
    "lookup": Annotated[
        bool,
        typer.Option(
            "--lookup",
            help="Speculative decoding with prompt-lookup n-gram drafts (fast when the reply repeats the prompt).",
            rich_help_panel=ENGINE,
        ),
    ],
    "kv_shift": Annotated[
        bool,
        typer.Option(
            "--kv-shift/--no-kv-shift",
            help="After the context is trimmed, shift the cached tokens (fast) instead of prefilling them again (exact).",
            rich_help_panel=CONTEXT,
        ),
    ],
    "ctx_checkpoints": Annotated[
        int,
        typer.Option(
            "--ctx-checkpoints",
            min=0,
            help="Recurrent and hybrid models (Qwen3.5, LFM2, Granite 4.0-H, Nemotron-H): copies of the recurrent state kept, so a prompt that leaves the cache (/retry, /undo, /edit) is prefilled from near there, as llama-server's flag. 0 = none.",
            rich_help_panel=ENGINE,
        ),
    ],
    "ctx_checkpoints_mib": Annotated[
        int,
        typer.Option(
            "--ctx-checkpoints-mib",
            min=0,
            help="The most memory those checkpoints take, in MiB (the oldest go first).",
            rich_help_panel=ENGINE,
        ),
    ],
    "mmproj": Annotated[
        Optional[Path],
        typer.Option(
            "--mmproj",
            help="The multimodal projector (mmproj .gguf) that lets the model see images or hear audio (-f photo.png). Default: an mmproj*.gguf beside the model.",
            rich_help_panel=FILES,
        ),
    ],
    "draft_model": Annotated[
        Optional[Path],
        typer.Option(
            "--draft-model",
            help="Speculative decoding with a small draft model of the same vocabulary.",
            rich_help_panel=ENGINE,
        ),
    ],
    "server": Annotated[
        Optional[list[str]],
        typer.Option(
            "--server",
            help="Use a running server instead of a local model: llama-server (best: local template, remote KV reuse) or any OpenAI-compatible URL. -m then names the server's model (or a local copy of its GGUF). A configured [servers.NAME] is used as -m NAME:MODEL. Repeatable: batch spreads its items over every server, ask and chat use the first that answers.",
            rich_help_panel=SERVERS,
        ),
    ],
    "connect_timeout": Annotated[
        Optional[float],
        typer.Option(
            "--connect-timeout", help="Seconds to wait for a server connection. Default: 10.", rich_help_panel=SERVERS
        ),
    ],
    "read_timeout": Annotated[
        Optional[float],
        typer.Option(
            "--read-timeout",
            help="Seconds a server may stay silent mid-request (prefill included). Default: 600.",
            rich_help_panel=SERVERS,
        ),
    ],
    "verbose": Annotated[
        bool,
        typer.Option(
            "--verbose", "-v", help="Show llama.cpp's log and llmchat's decisions on stderr.", rich_help_panel=OUTPUT
        ),
    ],
    "debug": Annotated[bool, typer.Option("--debug", help="Show tracebacks.", rich_help_panel=OUTPUT)],
}

_SAMPLING_OPTIONS = {
    "saved_prompt": Annotated[
        Optional[str],
        typer.Option(
            "--prompt",
            "-p",
            help="Apply a saved prompt from the config's [prompts.NAME]: its system prompt, model, preset, sampling and schema. Flags override it (llmchat prompts list). mcp:SERVER/NAME: an MCP server's prompt, its messages open the conversation (--prompt-arg k=v).",
            rich_help_panel=SAMPLING,
        ),
    ],
    "system": Annotated[Optional[str], typer.Option("--system", "-s", help="System prompt.", rich_help_panel=SAMPLING)],
    "preset": Annotated[
        Optional[str], typer.Option("--preset", help="precise | balanced | creative | code.", rich_help_panel=SAMPLING)
    ],
    "temperature": Annotated[
        Optional[float], typer.Option("--temperature", "--temp", help="0 = greedy.", rich_help_panel=SAMPLING)
    ],
    "top_p": Annotated[
        Optional[float], typer.Option("--top-p", help="Nucleus sampling mass, in (0, 1].", rich_help_panel=SAMPLING)
    ],
    "top_k": Annotated[
        Optional[int],
        typer.Option("--top-k", help="Keep the k most likely tokens (0 = off).", rich_help_panel=SAMPLING),
    ],
    "min_p": Annotated[
        Optional[float],
        typer.Option("--min-p", help="Drop tokens below min_p × the top probability.", rich_help_panel=SAMPLING),
    ],
    "repeat_penalty": Annotated[
        Optional[float], typer.Option("--repeat-penalty", help="1 = off.", rich_help_panel=SAMPLING)
    ],
    "max_tokens": Annotated[
        Optional[int],
        typer.Option(
            "--max-tokens",
            "-n",
            help="Most tokens in a reply (also the reply reserve). Default: the room left.",
            rich_help_panel=SAMPLING,
        ),
    ],
    "seed": Annotated[
        Optional[int],
        typer.Option("--seed", help="Fix the random seed. Default: a fresh seed per reply.", rich_help_panel=SAMPLING),
    ],
    "loop_stop": Annotated[
        bool,
        typer.Option(
            "--loop-stop/--no-loop-stop",
            help="End a reply that keeps repeating the same span (finish_reason loop).",
            rich_help_panel=SAMPLING,
        ),
    ],
    "stop": Annotated[
        Optional[list[str]], typer.Option("--stop", help="Stop string (repeatable).", rich_help_panel=SAMPLING)
    ],
}


_REASONING_OPTIONS = {
    "think": Annotated[
        Optional[bool],
        typer.Option(
            "--think/--no-think",
            help="Turn a reasoning model's thinking on or off, through its template's own switch (enable_thinking). Default: the model's.",
            show_default=False,
            rich_help_panel=REASONING,
        ),
    ],
    "reasoning_effort": Annotated[
        Optional[str],
        typer.Option(
            "--reasoning-effort",
            help="low | medium | high, for templates with an effort level (gpt-oss reasoning_effort).",
            rich_help_panel=REASONING,
        ),
    ],
    "thinking_budget": Annotated[
        Optional[int],
        typer.Option(
            "--thinking-budget",
            help="After N generated tokens still in thinking, close the thinking and let the model answer.",
            rich_help_panel=REASONING,
        ),
    ],
    "template_var": Annotated[
        Optional[list[str]],
        typer.Option(
            "--template-var",
            help='KEY=VALUE passed to the chat template (VALUE read as JSON when it is: true, 3, "x"). Repeatable.',
            rich_help_panel=REASONING,
        ),
    ],
    "reasoning_preserve": Annotated[
        Optional[bool],
        typer.Option(
            "--reasoning-preserve/--no-reasoning-preserve",
            help="Keep the thinking of every earlier turn in the prompt, for templates with a switch for it (GLM 4.7 clear_thinking, DeepSeek V4 drop_thinking, Qwen 3.6 preserve_thinking). Default: the template decides.",
            show_default=False,
            rich_help_panel=REASONING,
        ),
    ],
    "hide_thinking": Annotated[
        bool,
        typer.Option("--hide-thinking", help="Show only the answer, not the thinking.", rich_help_panel=REASONING),
    ],
    "show_thinking": Annotated[
        bool,
        typer.Option(
            "--show-thinking",
            help="Print the thinking on stdout too, between <thinking> and </thinking>, before the answer.",
            rich_help_panel=REASONING,
        ),
    ],
}
_STRUCTURED_OPTIONS = {
    "schema": Annotated[
        Optional[str],
        typer.Option(
            "--schema",
            help="Hold the reply to a JSON Schema: a name from the config's [schemas], a .json file, inline JSON, or fields: 'title, year int, genres list[str]: up to three'. The record gets `parsed`.",
            rich_help_panel=STRUCTURED,
        ),
    ],
    "schema_multi": Annotated[
        bool,
        typer.Option(
            "--schema-multi", help='Ask for several: {"items": [...]} of the --schema.', rich_help_panel=STRUCTURED
        ),
    ],
    "output_format": Annotated[
        Optional[str],
        typer.Option("--format", help="json: the reply is one JSON object (no schema).", rich_help_panel=STRUCTURED),
    ],
    "grammar_file": Annotated[
        Optional[Path],
        typer.Option(
            "--grammar", help="Hold the reply to a GBNF grammar file (llama.cpp's format).", rich_help_panel=STRUCTURED
        ),
    ],
}
# `--prompt-arg k=v` of `-p mcp:SERVER/NAME` (ask and chat; llmchat.tools.mcp.sources).
PromptArgOption = Annotated[
    Optional[list[str]],
    typer.Option(
        "--prompt-arg",
        help="An argument of the MCP prompt -p mcp:SERVER/NAME, as NAME=VALUE (repeatable). A required one not given is asked for on a terminal.",
        rich_help_panel=SAMPLING,
    ),
]


def model_command(*, sampling: bool = True) -> Callable:
    """Decorate a Typer command taking `opts: RunOptions` and `env: Environment` so it also accepts
    the shared options."""
    shared = dict(_ENGINE_OPTIONS) | (
        dict(_SAMPLING_OPTIONS) | dict(_REASONING_OPTIONS) | dict(_STRUCTURED_OPTIONS) if sampling else {}
    )
    defaults = option_defaults()

    def decorate(func: Callable) -> Callable:
        signature = inspect.signature(func)
        own = [p for p in signature.parameters.values() if p.name not in ("opts", "env")]
        added = [
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                default=(None if name in LISTS else defaults[name]),
                annotation=annotation,
            )
            for name, annotation in shared.items()
        ]

        @functools.wraps(func)
        def wrapper(**kwargs):
            # Missing when called directly (bare `llmchat` invokes `chat` itself): the defaults.
            env = current_environment()
            opts = take_run_options(kwargs, shared, env.config)
            return func(**kwargs, opts=opts, env=env)

        wrapper.__signature__ = signature.replace(parameters=own + added)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in own + added}
        return wrapper

    return decorate


# `ask` and `chat` show replies the same way on a terminal (llmchat.ui.markdown); a pipe gets plain text.
RenderOption = Annotated[
    Optional[str],
    typer.Option(
        "--render",
        metavar="[markdown|plain]",
        help="Replies on a terminal: markdown (rendered while they stream) | plain. Default: the config's render, else markdown. Not a terminal: always plain.",
        show_default=False,
        rich_help_panel=OUTPUT,
    ),
]
