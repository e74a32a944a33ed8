"""The TOML config file, read once into a frozen dataclass.

Example (`llmchat config path` prints where it lives):

    model = "smollm2"            # default model: a path, a models-folder name or an alias below
    preset = "balanced"          # precise | balanced | creative | code
    system = "You are concise."  # default system prompt
    stats = true                 # live TTFT / tok/s readout in chat
    history = true               # save conversations in SQLite
    ctx = 4096                   # default context window
    flash_attn = true            # false: faster long chats on CPU (see the README)
    markdown = false

    [sampling]                   # any of: temperature top_p top_k min_p repeat_penalty max_tokens seed
    temperature = 0.6

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
from llmchat.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

_TOP_LEVEL = {
    "model": str,
    "preset": str,
    "system": str,
    "stats": bool,
    "history": bool,
    "ctx": int,
    "flash_attn": bool,
    "markdown": bool,
    "template": str,
    "sampling": dict,
    "models": dict,
}
_ALIAS_KEYS = {"path": str, "template": str, "ctx": int}


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
    flash_attn: bool | None = None
    markdown: bool = False
    template: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    models: dict[str, dict[str, Any]] = field(default_factory=dict)

    def alias_for_path(self, model_path: Path) -> dict[str, Any]:
        """Per-model settings for a file, whichever way it was named on the command line."""
        for alias in self.models.values():
            if Path(str(alias.get("path", ""))).expanduser().resolve() == model_path.resolve():
                return alias
        return {}


def _type_name(kind: type) -> str:
    return {str: "a string", bool: "true or false", int: "a whole number", dict: "a table"}[kind]


def _check_type(path: Path, key: str, value: Any, kind: type) -> None:
    # bool is a subclass of int in Python; `ctx = true` must still be refused.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigError(f"config file {path}: {key} must be {_type_name(kind)}; fix or remove that line")


def load_config(path: Path | None = None) -> Config:
    path = path or paths.config_file()
    try:
        raw = path.read_bytes()
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
    return Config(path=path, exists=True, **data)
