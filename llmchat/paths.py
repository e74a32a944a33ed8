"""Where llmchat keeps its files. Nothing is created on import; callers create what they write to.

`LLMCHAT_HOME` overrides every folder (config, data, models, history, cache), which is also how
the tests keep each run in a temporary directory.

Folders llmchat creates for conversations are 0700 (`private_files.ensure_private_dir`); a folder
the user chose and that exists already (LLMCHAT_HOME) keeps its own mode.
"""

from __future__ import annotations

import os
from pathlib import Path

APP_NAME = "llmchat"


def _home_override() -> Path | None:
    value = os.environ.get("LLMCHAT_HOME")
    return Path(value).expanduser() if value else None


def config_dir() -> Path:
    home = _home_override()
    if home is not None:
        return home
    import platformdirs

    return Path(platformdirs.user_config_dir(APP_NAME, appauthor=False))


def data_dir() -> Path:
    home = _home_override()
    if home is not None:
        return home
    import platformdirs

    return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))


def cache_dir() -> Path:
    """Files that can be rebuilt (the KV cache on disk, flash-attention measurements): platformdirs'
    user cache dir, or `cache/` inside LLMCHAT_HOME."""
    home = _home_override()
    if home is not None:
        return home / "cache"
    import platformdirs

    return Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False))


def kv_cache_dir() -> Path:
    """The KV cache on disk (llmchat.engine.kv_store): one file per saved conversation state."""
    return cache_dir() / "kv"


def flash_attn_dir() -> Path:
    """What `llmchat bench --calibrate` measured for `--flash-attn auto` (llmchat.engine.calibrate)."""
    return cache_dir() / "flash_attn"


def mcp_media_dir() -> Path:
    """Images, audio and blobs that MCP servers return (llmchat.tools.mcp.results), named by hash."""
    return cache_dir() / "mcp"


def config_file() -> Path:
    return config_dir() / "config.toml"


def models_dir() -> Path:
    return data_dir() / "models"


def history_db() -> Path:
    return data_dir() / "history.db"


def input_history_file() -> Path:
    """prompt-toolkit's line history for the interactive chat."""
    return data_dir() / "input_history"
