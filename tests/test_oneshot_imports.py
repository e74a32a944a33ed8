"""What a one-shot `llmchat ask` imports: only what its own run uses.

Each module a process imports stays in its memory, and a one-shot `ask` on a small model is
measured against `llama-completion`'s peak RSS (bench/oneshot_vs_completion.py). These tests pin
the cuts: Typer and every command's declaration (llmchat.quick_ask reads a one-shot `ask`'s options
itself; for other commands llmchat.cli builds the invoked command alone), OpenSSL
(llmchat.launch gives hashlib CPython's own hash functions), importlib.resources with zipfile
(the built-in templates are read from their folder) and the tool machinery when no tool is asked
for, and standard-library modules a plain one-shot does not use (statistics, glob, shlex).
They check imported module names, which do not depend on the machine or its load.
"""

from __future__ import annotations

import subprocess
import sys

from llmchat.cli import GROUPS, TOP_COMMANDS

REPORT = (
    "import atexit, runpy, sys\n"
    "def report():\n"
    "    sys.stderr.write('MODULES ' + ' '.join(sorted(sys.modules)) + '\\n')\n"
    "atexit.register(report)\n"
    "sys.argv = ['llmchat', *sys.argv[1:]]\n"
    "runpy.run_module('llmchat', run_name='__main__')\n"
)


def _run(*args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    result = subprocess.run(
        [sys.executable, "-c", REPORT, *args], capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL
    )
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("MODULES ")]
    return result, set(line.split()[1:])


def test_one_shot_ask_imports_no_other_command_nor_openssl_nor_the_tools(smollm2_path):
    result, loaded = _run(
        "ask", "--no-history", "-m", str(smollm2_path), "--temperature", "0", "--max-tokens", "4", "Hi"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    assert "llmchat.commands.ask_run" in loaded and "jinja2" in loaded and "hashlib" in loaded
    # Its options are read without Typer (llmchat.quick_ask): no command's declaration, ask's either.
    commands = {f"llmchat.commands.{module}" for module, _, _ in TOP_COMMANDS.values()}
    commands |= {f"llmchat.commands.{group}" for group, _, _ in GROUPS}
    assert not commands & loaded
    assert not {"llmchat.cli", "typer", "click"} & loaded
    assert "_hashlib" not in loaded  # OpenSSL's libcrypto: 3.5 MiB resident
    assert not {"zipfile", "importlib.resources"} & loaded
    assert not {"llmchat.tools.offer", "llmchat.tools.native", "llmchat.tools.families"} & loaded
    # No statistics (with fractions and decimal: the thread tuner keeps its own median), glob and
    # shlex only for a file pattern and an MCP command line, and MCP's configuration only for MCP.
    assert not {"statistics", "fractions", "decimal", "glob", "shlex", "llmchat.tools.mcp.config"} & loaded


def test_the_full_command_line_still_lists_every_command_and_group():
    result, loaded = _run("--help")
    assert result.returncode == 0, result.stderr
    for name in [*TOP_COMMANDS, *(group for group, _, _ in GROUPS)]:
        assert f" {name} " in result.stdout, name
    assert {f"llmchat.commands.{group}" for group, _, _ in GROUPS} <= loaded


def test_a_group_command_runs_from_the_lazily_built_app():
    result, loaded = _run("template", "list")
    assert result.returncode == 0, result.stderr
    assert "chatml" in result.stdout
    assert "_hashlib" not in loaded


def test_hashlib_without_openssl_gives_the_same_digests():
    script = (
        "import sys\n"
        "from llmchat.launch import _hashlib_without_openssl\n"
        "_hashlib_without_openssl()\n"
        "import hashlib\n"
        "assert '_hashlib' not in sys.modules\n"
        "import hmac\n"
        "print(hashlib.sha256(b'abc').hexdigest(), hashlib.sha1(b'abc').hexdigest(), hashlib.md5(b'abc').hexdigest())\n"
        "print(hmac.new(b'key', b'msg', hashlib.sha256).hexdigest())\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    digests, mac = result.stdout.splitlines()
    assert digests.split() == [
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
        "a9993e364706816aba3e25717850c26c9cd0d89d",
        "900150983cd24fb0d6963f7d28e17f72",
    ]
    assert mac == "2d93cbc1be167bcb1637a4a23cbff01a7878f0c50ee833954ea5221bb1b8c628"
