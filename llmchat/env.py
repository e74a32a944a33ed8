"""The environment a command runs in, built once by `cli.main` and handed to the command.

After httpie's `Environment`: the three streams and whether each is a terminal, the paths, and the
config file read once. Commands ask the environment instead of reading the config file themselves
or reaching for `sys.stdout`; the modules below them receive the `Config` (or a stream) they need.
Before it, one `ask -p X --schema Y -T z` parsed the TOML file four times, and a test could not
make a command believe it runs on a terminal: a test builds an `Environment` with its own streams
and isatty flags.

The config is read at its first use, not when the environment is built: `--help`, `--version` and
the commands that never look at it pay nothing, and a broken config file stops only the commands
that read it, as before. The defaults that several layers share live in `llmchat.defaults`.

`write_out` and `write_err` write text that came from outside llmchat (a model's, a server's, a
tool's, a file's) by the one rule of llmchat.edges.safe_text, with the streams' isatty flags.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from llmchat import paths
from llmchat.config import Config, load_config
from llmchat.edges.safe_text import for_stream
from llmchat.output import is_tty


class Environment:
    def __init__(
        self,
        *,
        stdin: TextIO | None = None,
        stdout: TextIO | None = None,
        stderr: TextIO | None = None,
        stdin_isatty: bool | None = None,
        stdout_isatty: bool | None = None,
        stderr_isatty: bool | None = None,
        config_path: Path | None = None,
        config: Config | None = None,
    ):
        # The streams of this moment: a test that swaps sys.stdout before building one is seen.
        self.stdin: TextIO = stdin if stdin is not None else sys.stdin
        self.stdout: TextIO = stdout if stdout is not None else sys.stdout
        self.stderr: TextIO = stderr if stderr is not None else sys.stderr
        self.stdin_isatty = is_tty(self.stdin) if stdin_isatty is None else stdin_isatty
        self.stdout_isatty = is_tty(self.stdout) if stdout_isatty is None else stdout_isatty
        self.stderr_isatty = is_tty(self.stderr) if stderr_isatty is None else stderr_isatty
        self._config_path = config_path
        self._config = config

    # --- text from outside llmchat on the streams (llmchat.edges.safe_text) -----------------------------
    def write_out(self, text: str) -> None:
        """Write `text` to stdout: made terminal-safe where stdout is a terminal, exact in a pipe
        (it is the answer). For text that came from outside: a model, a server, a tool, a file."""
        self.stdout.write(for_stream(text, self.stdout_isatty))
        self.stdout.flush()

    def write_err(self, text: str) -> None:
        """Write `text` to stderr: made terminal-safe where stderr is a terminal, exact elsewhere
        (a log keeps what was said)."""
        self.stderr.write(for_stream(text, self.stderr_isatty))
        self.stderr.flush()

    @property
    def config_path(self) -> Path:
        """Where the config file is (it may not exist): LLMCHAT_HOME's, else the platform's."""
        if self._config_path is None:
            self._config_path = self._config.path if self._config is not None else paths.config_file()
        return self._config_path

    @property
    def config(self) -> Config:
        """The config file, read at the first use and then kept: the one place llmchat reads it."""
        if self._config is None:
            self._config = load_config(self.config_path)
        return self._config

    # The folders, named here so a command need not know how they are chosen (llmchat.paths).
    @property
    def data_dir(self) -> Path:
        return paths.data_dir()

    @property
    def cache_dir(self) -> Path:
        return paths.cache_dir()

    @property
    def kv_cache_dir(self) -> Path:
        return paths.kv_cache_dir()

    @property
    def flash_attn_dir(self) -> Path:
        return paths.flash_attn_dir()

    @property
    def models_dir(self) -> Path:
        return paths.models_dir()

    @property
    def history_db(self) -> Path:
        return paths.history_db()

    @property
    def input_history_file(self) -> Path:
        return paths.input_history_file()


def current_environment() -> Environment:
    """The environment of the command now running: the one `cli.main` handed to click as the
    context object. A command run without it (Typer's test runner, a direct call) gets one built
    here and kept on its context, so the config is still read once per run."""
    try:  # recent Typer vendors its own copy of click; its context is the one that is current
        from typer._click.globals import get_current_context  # type: ignore[import-not-found,unused-ignore]
    except ImportError:  # pragma: no cover - older Typer
        from click import get_current_context  # type: ignore[no-redef,unused-ignore]

    context = get_current_context(silent=True)
    if context is None:
        return Environment()
    return context.ensure_object(Environment)
