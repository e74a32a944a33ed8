"""The derived call and reasoning format of a template, kept on disk between runs (`cache/formats`).

An entry is keyed by everything that decides what llmchat.prompt.format_analysis finds: the
template text, the code of the analysis and of the sandbox it renders the template in
(KEY_SOURCES), jinja2's version, Python's and llmchat's. An upgrade of any of them reads as a
new key, so it means a new analysis, never a stale entry. An entry that cannot be read is
analysed again; one that cannot be written costs the next load an analysis, nothing else.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path

from llmchat import paths
from llmchat.prompt.layout import ChatFormat

# The modules whose code decides the analysis's result: it and every llmchat module it runs
# (tests/test_format_analysis.py checks the list against their imports), relative to the package.
KEY_SOURCES = (
    "prompt/format_analysis.py",
    "prompt/layout.py",
    "prompt/probes.py",
    "prompt/diffs.py",
    "prompt/sandbox.py",
    "prompt/sandbox_limits.py",
    "errors.py",
)


@lru_cache(maxsize=1)
def code_and_versions() -> str:
    """The part of every key that is not the template: the code of KEY_SOURCES and the versions
    of what runs it. jinja2 is imported by the template's own render anyway."""
    import sys

    import jinja2

    import llmchat

    package = Path(llmchat.__file__).parent
    versions = f"jinja2 {jinja2.__version__}\0python {sys.version}\0llmchat {llmchat.__version__}\0"
    texts = b"".join((package / name).read_bytes() + b"\0" for name in KEY_SOURCES)
    return hashlib.sha256(versions.encode() + texts).hexdigest()[:16]


def entry_for(source: str) -> Path:
    key = f"{code_and_versions()}\0{source}".encode("utf-8", "surrogatepass")
    return paths.cache_dir() / "formats" / f"{hashlib.sha256(key).hexdigest()[:40]}.json"


def read(source: str) -> ChatFormat | None:
    """The format kept for this template under this code and these versions; None: none (yet), or unreadable."""
    try:
        return ChatFormat.from_dict(json.loads(entry_for(source).read_bytes()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write(source: str, found: ChatFormat) -> None:
    """Keep `found` for this template (a private file, written whole or not at all)."""
    entry = entry_for(source)
    try:
        from llmchat.private_files import ensure_private_dir, write_private_atomic

        ensure_private_dir(entry.parent)
        write_private_atomic(entry, json.dumps(found.to_dict(), ensure_ascii=False).encode("utf-8"))
    except (OSError, ValueError):
        pass  # an unwritable cache folder costs the next load an analysis, nothing else
