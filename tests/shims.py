"""Changing llama.cpp's behaviour inside a real `python -m llmchat` run, from the test only.

`sitecustomize_env(folder, source)` writes `source` as a `sitecustomize.py` into `folder` and gives
the environment that puts it first on PYTHONPATH: Python runs it at start-up, before llmchat's own
code, so it can wrap a binding (`llama_decode`) that llmchat then calls as usual. Nothing in
llmchat reads anything for it.

`DECODE_SHIM` wraps `llama_decode`; the test fills in what the wrapper does at a given call.
"""

from __future__ import annotations

import os
from pathlib import Path

# `{setup}` runs once; `{on_decode}` runs before each llama_decode call, with `batch` (its
# `n_tokens`), `calls` (the count of calls with that many tokens so far, this one included) and
# `result` (set it to an int to return that instead of decoding).
DECODE_SHIM = """
import pathlib
import time

import llmchat.engine.bindings as _bindings

_llama = _bindings.llama_cpp
_real_decode = _llama.llama_decode
_counts = {{}}
{setup}


def _decode(ctx, batch):
    _counts[batch.n_tokens > 1] = calls = _counts.get(batch.n_tokens > 1, 0) + 1
    result = None
{on_decode}
    return _real_decode(ctx, batch) if result is None else result


_llama.llama_decode = _decode
"""


def sitecustomize_env(folder: Path, source: str, base: dict[str, str] | None = None) -> dict[str, str]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(source, encoding="utf-8")
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join([str(folder), *filter(None, [env.get("PYTHONPATH")])])
    return env


def decode_shim(setup: str = "", on_decode: str = "") -> str:
    """DECODE_SHIM with its two blocks (`on_decode` is indented into the wrapper here)."""
    body = "\n".join("    " + line for line in on_decode.strip("\n").splitlines()) or "    pass"
    return DECODE_SHIM.format(setup=setup, on_decode=body)
