"""What a one-shot `llmchat ask` imports: only what its own run uses.

Each module a process imports stays in its memory, and a one-shot `ask` on a small model is
measured against `llama-completion`'s peak RSS (bench/oneshot_vs_completion.py). These tests pin
the cuts: Typer and every command's declaration (llmchat.commands.quick_ask reads a one-shot `ask`'s options
itself; for other commands llmchat.cli builds the invoked command alone), importlib.resources with
zipfile (the built-in templates are read from their folder) and the tool machinery when no tool is
asked for, and standard-library modules a plain one-shot does not use (statistics, glob, shlex).
They check imported module names, which do not depend on the machine or its load.

`hashlib` is Python's own, as the interpreter was built: a one-shot runs on a CPython whose
built-in hash functions are only blake2 (Fedora's and RHEL's), where OpenSSL gives SHA-256.
"""

from __future__ import annotations

import os
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


def test_one_shot_ask_imports_no_other_command_nor_the_tools(smollm2_path):
    result, loaded = _run(
        "ask", "--no-history", "-m", str(smollm2_path), "--temperature", "0", "--max-tokens", "4", "Hi"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    assert "llmchat.commands.ask_run" in loaded and "jinja2" in loaded and "hashlib" in loaded
    # Its options are read without Typer (llmchat.commands.quick_ask): no command's declaration, ask's either.
    commands = {f"llmchat.commands.{module}" for module, _, _ in TOP_COMMANDS.values()}
    commands |= {f"llmchat.commands.{group}" for group, _, _ in GROUPS}
    assert not commands & loaded
    assert not {"llmchat.cli", "typer", "click"} & loaded
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


# What Fedora's and RHEL's CPython lacks: it is built with --with-builtin-hashlib-hashes=blake2,
# so md5, sha1, sha2 and sha3 come from OpenSSL's `_hashlib` alone. (3.11 and before name the
# sha2 modules _sha256 and _sha512; 3.12 on, _sha2.)
BLAKE2_ONLY = (
    "import sys\n"
    "for name in ('_md5', '_sha1', '_sha256', '_sha512', '_sha2', '_sha3'):\n"
    "    sys.modules[name] = None  # None: `import name` fails, as where the module was never built\n"
)


def test_ask_runs_on_a_python_whose_own_hashes_are_only_blake2(tmp_path, smollm2_path):
    """A one-shot `ask` hashes with SHA-256 (the header cache's keys, the KV cache's names). On a
    CPython built with blake2 as its only built-in hash, SHA-256 is OpenSSL's: hiding OpenSSL's
    `_hashlib` to save memory made every `ask` there fail with a traceback (AttributeError:
    module 'hashlib' has no attribute 'sha256'). Here a `sitecustomize` makes the child such a
    Python, and the ask must answer."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(BLAKE2_ONLY)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), *sys.path]))
    env["LLMCHAT_HOME"] = str(tmp_path / "home")
    probe = subprocess.run(
        [sys.executable, "-c", "import _sha256"], capture_output=True, text=True, env=env, timeout=60
    )
    assert probe.returncode != 0, "the child still has CPython's own sha256"
    ask = ("ask", "--no-history", "-m", str(smollm2_path), "-n", "4", "--temp", "0", "Hi")
    result = subprocess.run(
        [sys.executable, "-m", "llmchat", *ask],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    assert "Traceback" not in result.stderr and "hash" not in result.stderr, result.stderr
