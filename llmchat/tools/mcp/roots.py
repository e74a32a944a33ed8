"""The client's roots (`roots/list`): the folders a server may work in.

They are the working directory, then each `--root DIR` given to the command, as `file://` URIs of
absolute resolved paths, in that order and without repeats. The command sets them once
(use_roots), before any server starts, and they do not change during a run: llmchat never sends
`notifications/roots/list_changed` (the SDK still declares `listChanged`, which only says the client
could). A server asks for them whenever it likes; each answer reads the list as it is then.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llmchat.errors import UsageError

# The --root folders of this run (resolved). One run, one list: set by the command, read by each
# connection, so the option needs no road through every place a server is started.
_extra_roots: tuple[Path, ...] = ()


def checked_root(text: str) -> Path:
    """`--root DIR` as an absolute resolved folder; a usage error (exit 2) if it is not one."""
    path = Path(text).expanduser()
    if not path.is_dir():
        why = "no such folder" if not path.exists() else "not a folder"
        raise UsageError(f"--root {text}: {why}")
    return path.resolve()


def use_roots(folders: Sequence[str] | None) -> None:
    """Check and keep this run's --root folders (none: only the working directory)."""
    global _extra_roots
    _extra_roots = tuple(checked_root(folder) for folder in folders or ())


def root_paths() -> list[Path]:
    """The working directory, then the --root folders, each once."""
    paths: list[Path] = []
    for path in (Path.cwd().resolve(), *_extra_roots):
        if path not in paths:
            paths.append(path)
    return paths


def roots_result() -> Any:
    """The answer to `roots/list`: each root's URI, named after its folder."""
    from mcp_types import ListRootsResult, Root

    roots = [Root.model_validate({"uri": path.as_uri(), "name": path.name or str(path)}) for path in root_paths()]
    return ListRootsResult(roots=roots)


async def answer_list_roots(context: Any) -> Any:
    """The SDK's list_roots_callback (giving it declares the roots capability)."""
    return roots_result()
