"""The TOML config file, read once into a frozen dataclass.

Example (`llmchat config path` prints where it lives):

    model = "smollm2"            # default model: a path, a models-folder name or an alias below
    preset = "balanced"          # precise | balanced | creative | code
    system = "You are concise."  # default system prompt
    stats = true                 # live TTFT / tok/s readout in chat
    history = true               # save conversations in SQLite
    ctx = 4096                   # default context window
    flash_attn = "auto"          # auto (measured: llmchat bench --calibrate) | true | false
    prompt_cache = true          # the KV cache on disk: ask -c / chat --resume skip the prefill
    prompt_cache_max_bytes = 2147483648  # its size bound (least recently used files go first)
    render = "markdown"          # markdown | plain: replies on a terminal (a pipe always gets plain text)
    editing_mode = "emacs"       # emacs | vi: the chat prompt's keys (Ctrl-X Ctrl-E, or v in vi, opens $EDITOR)
    think = true                 # reasoning models: thinking on/off (their template's switch)
    thinking_budget = 512        # close the thinking after this many tokens
    compact = "auto"             # auto | off: summarise older exchanges when a turn passes the threshold
    compact_threshold = 0.8      # ... of the context (prompt + the reply's reserve); /compact any time
    compact_summary_tokens = 512 # the summary's cap (and at most 1/8 of the context)
    lazy_tools = 0.25            # tools past this share of the context are offered lazily (0: always, 1: never)

    [sampling]                   # any of: temperature top_p top_k min_p repeat_penalty max_tokens seed
    temperature = 0.6

    model_dirs = ["~/gguf"]      # more folders of models for `llmchat models list` and -m NAME

    [servers.big]                # a server: llmchat chat -m big:MODEL (or -m big for its first model)
    url = "http://gpu-box:8080"
    kind = "auto"                # auto | llama.cpp | openai | ollama
    api_key_env = "BIG_API_KEY"  # the key itself never goes in this file
    [servers.farm]               # a group serving one model: batch --server farm spreads over them
    urls = ["http://box1:8080", "http://box2:8080"]

    [schemas]                    # llmchat ask --schema movie "..."
    movie = "title, year int, genres list[str]"

    [tools.weather]              # a command the model may call (argv list, no shell): llmchat tools list
    command = ["weather-cli", "{city}"]
    description = "Today's weather for a city"
    parameters = { type = "object", properties = { city = { type = "string" } }, required = ["city"] }

    [mcp.time]                   # an MCP server over stdio; its tools are named time_TOOL
    command = "mcp-server-time"
    [prompts.reviewer]           # a saved prompt: llmchat chat -p reviewer (llmchat.startup.saved_prompts)
    system = "You review Python code."
    preset = "precise"

    [models.qwen]                # an alias: llmchat chat -m qwen
    path = "~/models/qwen2.5-1.5b-instruct-q4_k_m.gguf"
    template = "qwen2.5"
    ctx = 8192
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmchat import paths
from llmchat.edges.bounded_input import ANY_TEXT, read_file
from llmchat.engine.sampling import PRESETS, SETTABLE, parse_value
from llmchat.errors import ConfigError, UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]

_TOP_LEVEL = {
    "model": str,
    "preset": str,
    "system": str,
    "stats": bool,
    "history": bool,
    "ctx": int,
    "flash_attn": object,  # true | false | "auto", checked in load_config
    "prompt_cache": bool,
    "prompt_cache_max_bytes": int,
    "compact": str,  # auto | off, checked in load_config
    "compact_threshold": object,  # a number in (0, 1], checked in load_config
    "compact_summary_tokens": int,
    "lazy_tools": object,  # a number in [0, 1], checked in load_config
    "render": str,
    "editing_mode": str,  # emacs | vi, checked in load_config
    "template": str,
    "sampling": dict,
    "models": dict,
    "servers": dict,
    "model_dirs": list,
    "think": bool,
    "reasoning_effort": str,
    "thinking_budget": int,
    "hide_thinking": bool,
    "reasoning_preserve": bool,
    "schemas": dict,
    "tools": dict,  # [tools.NAME]: checked by llmchat.tools.command_tools when used
    "mcp": dict,  # [mcp.NAME]: checked by llmchat.tools.mcp.config when used
    "prompts": dict,
}
_ALIAS_KEYS = {"path": str, "template": str, "ctx": int}
_SERVER_KEYS = {
    "url": str,
    "urls": list,  # a group of servers serving the same model: batch spreads over them
    "kind": str,
    "api_key_env": str,
    "model": str,
    "connect_timeout": float,
    "read_timeout": float,
}
_SERVER_KINDS = ("auto", "llama.cpp", "openai", "ollama")
EDITING_MODES = ("emacs", "vi")  # the chat prompt's keys, as prompt-toolkit and IPython name them
# The keys a [prompts.NAME] table may hold besides the sampling values (sampling.SETTABLE).
PROMPT_TEXT_KEYS = ("system", "model", "template", "preset", "schema", "description")


@dataclass(frozen=True)
class Config:
    path: Path
    exists: bool = False
    model: str | None = None
    preset: str | None = None
    system: str | None = None
    stats: bool = True
    history: bool = True
    ctx: int | None = None
    flash_attn: bool | str | None = None  # True | False | "auto"
    prompt_cache: bool = True
    prompt_cache_max_bytes: int = 2 * 1024**3
    # Compaction (llmchat.turn.compaction): on its own past the threshold, and the summary's cap.
    compact: str = "auto"
    compact_threshold: float = 0.8
    compact_summary_tokens: int = 512
    lazy_tools: float = 0.25  # llmchat.tools.lazy.DEFAULT_SHARE
    render: str | None = None  # "markdown" | "plain"; None: markdown on a terminal (llmchat.ui.markdown)
    editing_mode: str = "emacs"  # the chat prompt's keys: "emacs" | "vi" (llmchat.ui.editing)
    template: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    servers: dict[str, dict[str, Any]] = field(default_factory=dict)  # [servers.NAME]: url, kind, api_key_env, ...
    model_dirs: list[str] = field(default_factory=list)  # more folders `models list` and `-m NAME` search
    # Reasoning models: the defaults of --think/--no-think, --reasoning-effort, --thinking-budget, --hide-thinking,
    # --reasoning-preserve.
    think: bool | None = None
    reasoning_effort: str | None = None
    thinking_budget: int | None = None
    hide_thinking: bool = False
    reasoning_preserve: bool = False  # --reasoning-preserve's default (llmchat.reasoning.formats)
    # Named schemas for --schema NAME: a fields string ("title, year int"), JSON text, or a table.
    schemas: dict[str, Any] = field(default_factory=dict)
    # Tools the model may call: [tools.NAME] commands and [mcp.NAME] servers (llmchat.tools).
    tools: dict[str, Any] = field(default_factory=dict)
    mcp: dict[str, Any] = field(default_factory=dict)
    # Each [mcp.NAME]'s `tools = ["name", "glob_*"]`: only those of its tools are offered
    # (llmchat.tools.registry). Read apart here, so the server's own table keeps its own keys.
    mcp_tools: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Saved prompts for -p NAME / /prompt NAME: system, model, preset, sampling, schema (llmchat.startup.saved_prompts).
    prompts: dict[str, Any] = field(default_factory=dict)

    def alias_for_path(self, model_path: Path) -> dict[str, Any]:
        """Per-model settings for a file, whichever way it was named on the command line."""
        for alias in self.models.values():
            if Path(str(alias.get("path", ""))).expanduser().resolve() == model_path.resolve():
                return alias
        return {}


def _type_name(kind: type) -> str:
    return {str: "a string", bool: "true or false", int: "a whole number", dict: "a table", list: "a list"}[kind]


def _check_type(path: Path, key: str, value: Any, kind: type) -> None:
    # bool is a subclass of int in Python; `ctx = true` must still be refused.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigError(f"config file {path}: {key} must be {_type_name(kind)}; fix or remove that line")


def load_config(path: Path | None = None) -> Config:
    path = path or paths.config_file()
    try:
        raw = read_file(path, f"config file {path}", ANY_TEXT, advice="make it a TOML file, or set LLMCHAT_HOME")
    except FileNotFoundError:
        return Config(path=path)
    except IsADirectoryError:
        raise ConfigError(f"config path {path} is a directory; remove it or set LLMCHAT_HOME") from None
    except PermissionError:
        raise ConfigError(f"config file {path} is not readable; fix its permissions") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text; rewrite it as TOML") from None
    except tomllib.TOMLDecodeError as err:
        # The decoder's message already carries "(at line N, column M)".
        raise ConfigError(f"config file {path} is not valid TOML: {err}") from None

    for key, value in data.items():
        if key not in _TOP_LEVEL:
            raise ConfigError(f"config file {path}: unknown key {key!r}; known keys: {', '.join(_TOP_LEVEL)}")
        _check_type(path, key, value, _TOP_LEVEL[key])
    for alias, settings in data.get("models", {}).items():
        _check_type(path, f"models.{alias}", settings, dict)
        for key, value in settings.items():
            if key not in _ALIAS_KEYS:
                raise ConfigError(f"config file {path}: unknown key models.{alias}.{key}; use path, template or ctx")
            _check_type(path, f"models.{alias}.{key}", value, _ALIAS_KEYS[key])
        if "path" not in settings:
            raise ConfigError(f'config file {path}: models.{alias} needs a path = "..." line')
    for name, settings in data.get("servers", {}).items():
        _check_server(path, name, settings)
    for name, settings in data.get("prompts", {}).items():
        check_saved_prompt(path, name, settings)
    mcp_tools = _picked_mcp_tools(path, data.get("mcp", {}))
    for folder in data.get("model_dirs", []):
        _check_type(path, "each model_dirs entry", folder, str)
    flash_attn = data.get("flash_attn")
    if flash_attn is not None and not (isinstance(flash_attn, bool) or flash_attn == "auto"):
        raise ConfigError(f'config file {path}: flash_attn must be true, false or "auto"; fix or remove that line')
    if data.get("render", "markdown") not in ("markdown", "plain"):
        raise ConfigError(f'config file {path}: render must be "markdown" or "plain"; fix or remove that line')
    if data.get("editing_mode", "emacs") not in EDITING_MODES:
        raise ConfigError(f'config file {path}: editing_mode must be "emacs" or "vi"; fix or remove that line')
    if data.get("compact", "auto") not in ("auto", "off"):
        raise ConfigError(f'config file {path}: compact must be "auto" or "off"; fix or remove that line')
    threshold = data.get("compact_threshold", 0.8)
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold <= 1:
        raise ConfigError(f"config file {path}: compact_threshold must be a number above 0 and at most 1 (0.8: 80 %)")
    share = data.get("lazy_tools", 0.25)
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1:
        raise ConfigError(f"config file {path}: lazy_tools must be a number from 0 to 1 (0.25: 25 % of the context)")
    if data.get("compact_summary_tokens", 1) < 1:
        raise ConfigError(f"config file {path}: compact_summary_tokens must be 1 or more; fix or remove that line")
    if data.get("prompt_cache_max_bytes", 0) < 0:
        raise ConfigError(f"config file {path}: prompt_cache_max_bytes must be 0 or more; fix or remove that line")
    return Config(path=path, exists=True, mcp_tools=mcp_tools, **data)


def _picked_mcp_tools(path: Path, servers: dict[str, Any]) -> dict[str, tuple[str, ...]]:
    """Take each [mcp.NAME]'s `tools = [...]` out of its table (which llmchat.tools.mcp.config
    checks key by key), checked: a list of tool names or globs."""
    picked: dict[str, tuple[str, ...]] = {}
    for name, settings in servers.items():
        if not isinstance(settings, dict) or "tools" not in settings:
            continue
        names = settings.pop("tools")
        if not isinstance(names, list) or not names or not all(isinstance(n, str) and n.strip() for n in names):
            raise ConfigError(
                f'config file {path}: mcp.{name}.tools must be a list of tool names, e.g. ["get_current_time"]'
            )
        picked[name] = tuple(names)
    return picked


def _check_server(path: Path, name: str, settings: Any) -> None:
    """One [servers.NAME] table: a url, and optionally kind, api_key_env, model and timeouts."""
    _check_type(path, f"servers.{name}", settings, dict)
    for key, value in settings.items():
        if key in ("api_key", "key", "token"):
            raise ConfigError(
                f"config file {path}: servers.{name}.{key}: API keys are never stored in the config; put the key in "
                f'an environment variable and name it with api_key_env = "VARIABLE"'
            )
        if key not in _SERVER_KEYS:
            raise ConfigError(f"config file {path}: unknown key servers.{name}.{key}; use {', '.join(_SERVER_KEYS)}")
        if _SERVER_KEYS[key] is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(f"config file {path}: servers.{name}.{key} must be a number of seconds above 0")
        else:
            _check_type(path, f"servers.{name}.{key}", value, _SERVER_KEYS[key])
    if ("url" in settings) == ("urls" in settings):
        raise ConfigError(
            f'config file {path}: servers.{name} needs a url = "http://HOST:PORT" line, or urls = [...] for a group '
            "of servers (not both)"
        )
    urls = settings.get("urls")
    if urls is not None and not (urls and all(isinstance(url, str) and url.strip() for url in urls)):
        raise ConfigError(f'config file {path}: servers.{name}.urls must be a list of URLs, e.g. ["http://a:8080"]')
    if settings.get("kind", "auto") not in _SERVER_KINDS:
        raise ConfigError(f"config file {path}: servers.{name}.kind must be one of {', '.join(_SERVER_KINDS)}")


def check_saved_prompt(path: Path, name: str, settings: Any) -> tuple[dict[str, str], dict[str, Any]]:
    """One [prompts.NAME] table, checked when the config is read (a bad saved prompt is a config
    error naming the key, not a surprise at its first use): its text values and its sampling
    values, parsed as the flags are."""
    where = f"config file {path}: prompts.{name}"
    if not isinstance(settings, dict):
        raise ConfigError(f"{where} must be a table ([prompts.{name}]); fix or remove it")
    values: dict[str, str] = {}
    sampling: dict[str, Any] = {}
    for key, value in settings.items():
        if key in PROMPT_TEXT_KEYS:
            if not isinstance(value, str):
                raise ConfigError(f"{where}.{key} must be a string; fix or remove that line")
            values[key] = value
        elif key in SETTABLE:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{where}.{key} must be a number; fix or remove that line")
            try:
                sampling[key] = parse_value(key, repr(value))
            except UsageError as err:
                raise ConfigError(f"{where}: {err}") from None
        else:
            known = ", ".join((*PROMPT_TEXT_KEYS, *SETTABLE))
            raise ConfigError(f"{where}: unknown key {key!r}; known keys: {known}")
    if values.get("preset") is not None and values["preset"] not in PRESETS:
        raise ConfigError(f"{where}.preset must be one of {', '.join(PRESETS)}, got {values['preset']!r}")
    return values, sampling
