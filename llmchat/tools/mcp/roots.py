"""The client's roots (`roots/list`): the folders a server may work in, as the user gave them.

A server's roots are this run's `--root DIR` folders, then the `roots = [...]` of its own
`[mcp.NAME]` table, as `file://` URIs of absolute resolved paths, in that order and without
repeats. With none given, none are declared (an empty list): the working directory is never a root
of its own accord. A server that takes the client's roots in place of its own (the official
filesystem server does) was given the whole folder llmchat ran from, which the user never gave it
(run from the home folder, all of it); with an empty list it keeps the folders its own command line
names. The roots capability is always declared, so a server asks rather than guesses.

The command sets the --root folders once (use_roots), before any server starts, and they do not
change during a run: llmchat never sends `notifications/roots/list_changed` (the SDK still declares
`listChanged`, which only says the client could). A server asks whenever it likes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmchat.errors import UsageError

if TYPE_CHECKING:
    from mcp.client.session import ListRootsFnT

    from llmchat.tools.mcp.config import McpServerConfig

# The --root folders of this run (resolved). One run, one list: set by the command, read by each
# connection, so the option needs no road through every place a server is started.
_run_roots: tuple[Path, ...] = ()


def checked_root(text: str, what: str = "--root") -> Path:
    """A root as an absolute resolved folder; a usage error (exit 2) if it is not one."""
    path = Path(text).expanduser()
    if not path.is_dir():
        why = "no such folder" if not path.exists() else "not a folder"
        raise UsageError(f"{what} {text}: {why}")
    return path.resolve()


def use_roots(folders: Sequence[str] | None) -> None:
    """Check and keep this run's --root folders (none: no roots but the servers' own)."""
    global _run_roots
    _run_roots = tuple(checked_root(folder) for folder in folders or ())


def server_roots(server: McpServerConfig) -> list[Path]:
    """The roots declared to `server`: the --root folders, then its config's, each once."""
    where = f"MCP server {server.name}: roots ="
    paths: list[Path] = []
    for path in (*_run_roots, *(checked_root(folder, where) for folder in server.roots)):
        if path not in paths:
            paths.append(path)
    return paths


def reach(server: McpServerConfig) -> str:
    """What `llmchat mcp list` says the server may reach, in words."""
    paths = server_roots(server)
    if paths:
        return "roots: " + ", ".join(str(path) for path in paths)
    if server.transport == "stdio":
        return "roots: none (it works where its own command line says)"
    return "roots: none"


def roots_result(paths: Sequence[Path]) -> Any:
    """The answer to `roots/list`: each root's URI, named after its folder."""
    from mcp_types import ListRootsResult, Root

    roots = [Root.model_validate({"uri": path.as_uri(), "name": path.name or str(path)}) for path in paths]
    return ListRootsResult(roots=roots)


def list_roots_callback(server: McpServerConfig) -> ListRootsFnT:
    """The SDK's list_roots_callback for `server` (giving one declares the roots capability); its
    roots are checked now, before the server starts (a config root that is not a folder: exit 2)."""
    paths = server_roots(server)

    async def answer(context: Any) -> Any:
        return roots_result(paths)

    return answer
