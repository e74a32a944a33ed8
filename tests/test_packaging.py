"""The built wheel ships the templates and finds them at run time, outside the source tree."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_contains_templates_and_finds_them(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), "-q"],
        check=True,
        capture_output=True,
    )
    wheel = next((tmp_path / "dist").glob("llmchat-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    shipped = sorted(Path(n).name for n in names if n.startswith("llmchat/templates/") and n.endswith(".jinja"))
    source = sorted(p.name for p in (ROOT / "templates").glob("*.jinja"))
    assert shipped == source and "chatml.jinja" in shipped

    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), str(wheel), "-q"], check=True, capture_output=True)
    probe = "import llmchat.chat_template as t, sys; names = [x.name for x in t.builtin_templates()]; print(len(names)); print(t.__file__)"
    env = dict(os.environ, PYTHONPATH=str(target))
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path, check=True).stdout.split()
    assert int(out[0]) == len(source)
    assert out[1].startswith(str(target))  # the installed copy, not the source tree


def test_help_and_version_entry_points():
    out = subprocess.run([sys.executable, "-m", "llmchat", "--help"], capture_output=True, text=True, check=True).stdout
    for command in ("ask", "chat", "batch", "info", "bench", "template", "history", "config"):
        assert command in out
