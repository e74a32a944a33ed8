"""One environment per run (llmchat.env): the config file read once, the streams and their isatty
flags given by the caller, so a test runs a command in-process and fakes a terminal through it."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from llmchat.cli import main
from llmchat.env import Environment

CONFIG = """
[prompts.pirate]
system = "You are a pirate."
model = "MODEL"

[schemas]
movie = "title, year int"

[tools.weather]
command = ["echo", "{city}"]
description = "Today's weather for a city"
parameters = { type = "object", properties = { city = { type = "string" } }, required = ["city"] }
"""


def _fake_terminal(stdin: str = "", *, on_terminal: bool) -> Environment:
    return Environment(
        stdin=io.TextIOWrapper(io.BytesIO(stdin.encode()), encoding="utf-8"),
        stdout=io.StringIO(),
        stderr=io.StringIO(),
        stdin_isatty=on_terminal,
        stdout_isatty=on_terminal,
        stderr_isatty=on_terminal,
    )


def _run(args: list[str], env: Environment) -> int:
    with pytest.raises(SystemExit) as done:
        main(args, env)
    return int(done.value.code or 0)


def _count_config_reads(monkeypatch, config_file: Path) -> list[Path]:
    """Each read of `config_file`, through the one reader of outside files (llmchat.config reads
    with it)."""
    from llmchat import config

    reads: list[Path] = []
    read_file = config.read_file

    def counted(path: Path, *args, **kwargs) -> bytes:
        if path == config_file:
            reads.append(path)
        return read_file(path, *args, **kwargs)

    monkeypatch.setattr(config, "read_file", counted)
    return reads


def _write_config(home: Path, model: str) -> Path:
    home.mkdir(parents=True, exist_ok=True)
    config_file = home / "config.toml"
    config_file.write_text(CONFIG.replace("MODEL", model))
    return config_file


def test_ask_with_a_saved_prompt_a_schema_and_a_tool_reads_the_config_once(isolated_home, monkeypatch):
    """-p, --schema and -T each read the config; the load would too. The model the saved prompt names
    is missing, so the run stops at the load, after every one of them has looked."""
    config_file = _write_config(isolated_home, str(isolated_home / "missing.gguf"))
    reads = _count_config_reads(monkeypatch, config_file)
    env = _fake_terminal(on_terminal=True)
    code = _run(["ask", "-p", "pirate", "--schema", "movie", "-T", "weather", "hi"], env)
    assert code != 0 and "missing.gguf" in env.stderr.getvalue()
    assert len(reads) == 1


def test_ask_reads_the_config_once_through_a_whole_turn(isolated_home, monkeypatch, smollm2_path):
    """The issue's command loads the model and stops where the tools meet the schema (exit 2); without
    -T the turn runs to its JSON record. Each run reads the config file once."""
    config_file = _write_config(isolated_home, str(smollm2_path))
    reads = _count_config_reads(monkeypatch, config_file)
    env = _fake_terminal(on_terminal=False)
    assert _run(["ask", "-p", "pirate", "--schema", "movie", "-T", "weather", "hi"], env) == 2
    assert "cannot be combined" in env.stderr.getvalue() and len(reads) == 1

    reads.clear()
    env = _fake_terminal(on_terminal=False)
    args = ["ask", "-p", "pirate", "--schema", "movie", "--temperature", "0", "-n", "24", "--json", "--no-history"]
    code = _run([*args, "Name a film."], env)
    assert code in (0, 5), env.stderr.getvalue()  # 5: a reply cut at 24 tokens is not valid JSON
    assert json.loads(env.stdout.getvalue())["stats"]["generated_tokens"] > 0
    assert len(reads) == 1


def test_the_prompt_comes_from_the_environments_stdin(isolated_home):
    """Piped stdin is the environment's: the prompt is read from it (and an empty one refused)."""
    _write_config(isolated_home, str(isolated_home / "missing.gguf"))
    env = _fake_terminal("  \n", on_terminal=False)
    assert _run(["ask"], env) == 2
    assert "empty prompt" in env.stderr.getvalue() and env.stdout.getvalue() == ""


def test_bare_llmchat_off_a_terminal_prints_the_help_to_the_environments_stdout():
    env = _fake_terminal(on_terminal=False)
    assert _run([], env) == 0
    assert env.stdout.getvalue().startswith("Usage: llmchat")


def test_commands_write_to_the_environments_streams(isolated_home):
    _write_config(isolated_home, "smollm2")
    env = _fake_terminal(on_terminal=False)
    assert _run(["prompts", "list"], env) == 0
    assert env.stdout.getvalue().startswith("pirate  You are a pirate.")
    env = _fake_terminal(on_terminal=False)
    assert _run(["prompts", "show", "nope"], env) == 2
    assert env.stdout.getvalue() == "" and env.stderr.getvalue().count("\n") == 1


def test_the_config_is_read_at_first_use_and_kept(isolated_home, monkeypatch):
    config_file = _write_config(isolated_home, "smollm2")
    reads = _count_config_reads(monkeypatch, config_file)
    env = Environment()
    assert reads == [] and env.config_path == config_file
    assert env.config.prompts["pirate"]["system"] == "You are a pirate."
    assert env.config is env.config and len(reads) == 1


def test_ask_on_a_faked_terminal_shows_its_stats(isolated_home, smollm2_path):
    """Stats on stderr default to "on a terminal": the environment's isatty flags decide, not the
    streams, so a test sees what a person at a terminal sees."""
    outputs = {}
    for on_terminal in (True, False):
        env = _fake_terminal(on_terminal=on_terminal)
        args = ["ask", "-m", str(smollm2_path), "--temperature", "0", "-n", "4", "--no-history", "Hi"]
        assert _run(args, env) == 0, env.stderr.getvalue()
        assert env.stdout.getvalue().strip()
        outputs[on_terminal] = env.stderr.getvalue()
    assert "tok/s" in outputs[True] and "\r" in outputs[True]  # the summary, after the live readout
    assert "tok/s" not in outputs[False]
