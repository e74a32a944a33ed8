"""The built wheel ships every module and the templates, and answers a prompt when installed,
outside the source tree (a test run from the checkout would not notice a module left out)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_contains_templates_and_finds_them(tmp_path):
    # Built from a fresh copy: setuptools reuses a build/ folder, whose stale files would hide a
    # module that the package list leaves out.
    source_copy = tmp_path / "src"
    source_copy.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source_copy / name)
    for folder in ("llmchat", "templates"):
        shutil.copytree(ROOT / folder, source_copy / folder, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(source_copy),
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "dist"),
            "-q",
        ],
        check=True,
        capture_output=True,
    )
    wheel = next((tmp_path / "dist").glob("llmchat-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    shipped = sorted(Path(n).name for n in names if n.startswith("llmchat/templates/") and n.endswith(".jinja"))
    source = sorted(p.name for p in (ROOT / "templates").glob("*.jinja"))
    assert shipped == source and "chatml.jinja" in shipped
    modules = sorted(n for n in names if n.startswith("llmchat/") and n.endswith(".py"))
    in_tree = sorted(
        [p.relative_to(ROOT).as_posix() for p in (ROOT / "llmchat").rglob("*.py")]
        + [f"llmchat/templates/{p.name}" for p in (ROOT / "templates").glob("*.py")]  # shipped as llmchat.templates
    )
    assert modules == in_tree

    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), str(wheel), "-q"],
        check=True,
        capture_output=True,
    )
    probe = "import llmchat.prompt.builtins as t, sys; names = [x.name for x in t.builtin_templates()]; print(len(names)); print(t.__file__)"
    env = dict(os.environ, PYTHONPATH=str(target))
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path, check=True
    ).stdout.split()
    assert int(out[0]) == len(source)
    assert out[1].startswith(str(target))  # the installed copy, not the source tree

    # The installed copy runs the main job: the engine, the template and the bundled model.
    home = tmp_path / "home"
    asked = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmchat",
            "ask",
            "--no-history",
            "--temperature",
            "0",
            "--max-tokens",
            "8",
            "Name a colour.",
        ],
        capture_output=True,
        text=True,
        env=env | {"LLMCHAT_HOME": str(home)},
        cwd=tmp_path,
        timeout=300,
    )
    assert asked.returncode == 0, asked.stderr
    assert asked.stdout.strip()


def test_help_and_version_entry_points():
    out = subprocess.run([sys.executable, "-m", "llmchat", "--help"], capture_output=True, text=True, check=True).stdout
    for command in ("ask", "chat", "batch", "info", "bench", "template", "history", "config"):
        assert command in out
