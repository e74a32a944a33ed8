"""A one-shot `ask` parsed without Typer (llmchat.commands.quick_ask) runs exactly as Typer would run it.

For each option of `ask` (read from the table of its declaration), and for command lines that mix
them, both parsers run in-process up to `ask_run.run`, which records what it was given instead of
running: the same arguments and the same RunOptions, or, where the quick parser declines, Typer's
own. The table itself must be what the declaration writes now.
"""

from __future__ import annotations

import inspect
import io
from pathlib import Path

import pytest

from llmchat.commands import ask_run
from llmchat.commands.ask_flags import OPTIONS
from llmchat.env import Environment

VALUES = {"str": ["some text"], "int": ["3"], "int>=0": ["2"], "float": ["0.25"], "path": ["some/file.gguf"]}


@pytest.fixture(autouse=True)
def _handlers_restored(monkeypatch):
    """llmchat.cli.main installs llmchat's signal handlers in this process: undone afterwards, for
    the tests that expect Python's own."""
    import signal
    import sys

    from llmchat import interrupts

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    monkeypatch.setattr(interrupts, "_state", dict(interrupts._state, installed=False))
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def _environment(config_path: Path) -> Environment:
    return Environment(
        stdin=io.TextIOWrapper(io.BytesIO(b""), encoding="utf-8"),
        stdout=io.StringIO(),
        stderr=io.StringIO(),
        stdin_isatty=True,
        stdout_isatty=False,
        stderr_isatty=False,
        config_path=config_path,
    )


def _runs(
    monkeypatch: pytest.MonkeyPatch, args: list[str], config: Path = Path("/nonexistent/llmchat-test.toml")
) -> tuple[dict, dict | None]:
    """(what Typer's run gave ask_run.run, what the quick path's gave it; None: it declined)."""
    from llmchat.cli import main
    from llmchat.commands import quick_ask

    real = inspect.signature(ask_run.run)
    seen: list[dict] = []

    def record(**kwargs):
        bound = real.bind(**kwargs)
        bound.apply_defaults()
        seen.append({name: value for name, value in bound.arguments.items() if name != "env"})

    monkeypatch.setattr(ask_run, "run", record)
    outcomes = []
    for side in ("typer", "quick"):
        env = _environment(config)
        given = quick_ask.parse(args)
        if side == "quick" and given is None:
            outcomes.append(None)
            continue
        with pytest.raises(SystemExit) as done:
            main(["ask", *args], env=env) if side == "typer" else quick_ask.runner(given, env)()
        outcomes.append(
            {"exit": done.value.code, "stderr": env.stderr.getvalue(), "given": seen.pop() if seen else None}
        )
    return outcomes[0], outcomes[1]


def _one_use(flag: str, kind: str) -> list[str]:
    if kind in ("flag", "no-flag"):
        return [flag]
    if kind == "list":
        return [flag, "first", flag, "second"]
    return [flag, VALUES[kind][0]]


@pytest.mark.parametrize("flag", sorted(OPTIONS))
def test_each_option_reads_the_same_as_typer_reads_it(monkeypatch, tmp_path, flag):
    config = tmp_path / "config.toml"  # `-p "some text"` names a saved prompt: one by that name
    config.write_text('[prompts."some text"]\nsystem = "You are brief."\ntemperature = 0.1\n', encoding="utf-8")
    typer_run, quick_run = _runs(monkeypatch, [*_one_use(flag, OPTIONS[flag][1]), "the prompt"], config)
    assert quick_run is not None, "the quick parser declined a plain use of the option"
    assert typer_run["given"] is not None, typer_run["stderr"]
    assert quick_run == typer_run


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["hi"],
        ["-m", "model.gguf", "--ctx", "2048", "-t", "2", "--temperature", "0.5", "hi"],
        ["--json", "--no-stats", "-c", "--cid", "abc", "--overflow", "drop", "--compact", "off", "--no-history", "x"],
        ["-f", "a.txt", "--file", "b.txt", "-f", "-", "-T", "shell", "--tools", "x", "--tool-choice", "required", "q"],
        ["--temperature=0.7", "--seed=5", "--stop=a", "--stop", "b", "x"],
        ["x", "--json", "--stats", "--no-stats"],  # options after the prompt; the last of a pair wins
        ["--", "-not an option"],
        ["--system", "", "-f", "-", "x"],
        ["--ctx-checkpoints", "0", "--mmproj", "p.gguf", "x"],
    ],
)
def test_mixed_command_lines_read_the_same(monkeypatch, args):
    typer_run, quick_run = _runs(monkeypatch, args)
    assert quick_run == typer_run


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["-h"],
        ["--no-such-option", "x"],
        ["--ctx", "many", "x"],
        ["--ctx-checkpoints", "-1", "x"],
        ["--temperature", "warm", "x"],
        ["--json=yes", "x"],
        ["-cf", "a.txt", "x"],
        ["-n64", "x"],
        ["--system", "-be brief", "x"],
        ["--system"],
        ["one", "two"],
    ],
)
def test_what_the_quick_parser_does_not_read_goes_to_typer(args):
    from llmchat.commands import quick_ask

    assert quick_ask.parse(args) is None


def test_the_flags_table_is_the_declaration_s():
    from llmchat.commands import ask_flags
    from llmchat.commands.ask import flags_table

    written = Path(ask_flags.__file__).read_text(encoding="utf-8")
    assert written == flags_table(), "regenerate llmchat/commands/ask_flags.py (see flags_table's docstring)"


def test_ask_run_takes_the_declaration_s_parameters_and_defaults():
    from llmchat.commands.ask import ask

    declared = inspect.signature(ask).parameters
    for name, parameter in inspect.signature(ask_run.run).parameters.items():
        if name in ("opts", "env"):
            continue
        assert name in declared and declared[name].default == parameter.default, name


def test_a_one_shot_ask_runs_without_typer(smollm2_path):
    import subprocess
    import sys

    script = (
        "import atexit, sys\n"
        "atexit.register(lambda: sys.stderr.write('TYPER ' + str(any(m.startswith('typer') for m in sys.modules)) + '\\n'))\n"
        "sys.argv = ['llmchat', *sys.argv[1:]]\n"
        "from llmchat.launch import main\n"
        "main()\n"
    )
    args = ["ask", "--no-history", "-m", str(smollm2_path), "--temperature", "0", "--max-tokens", "4", "Hi"]
    result = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip(), result.stderr
    assert "TYPER False" in result.stderr
    # A line the quick parser leaves to Typer still runs (and reads the same: the tests above).
    result = subprocess.run(
        [sys.executable, "-c", script, *args[:-1], "-n4", "Hi"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0 and "TYPER True" in result.stderr, result.stderr
