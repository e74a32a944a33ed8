"""A small MCP server over stdio for the tool tests (built on the real SDK, run as a real process).

`echo` answers; `die` kills its own process in the middle of the call, as a crashing server would;
`touch` creates the file it is given (a visible side effect for the refusal tests); `sleep` takes
as long as it is told.
"""

import os
import signal
import time
from pathlib import Path

from mcp.server import MCPServer

server = MCPServer("dying")


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@server.tool()
def die() -> str:
    """Kill this server while the call is in flight."""
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


@server.tool()
def touch(path: str) -> str:
    """Create the file at path."""
    Path(path).write_text("touched", encoding="utf-8")
    return "done"


@server.tool()
def sleep(seconds: float) -> str:
    """Sleep, then answer."""
    time.sleep(seconds)
    return "awake"


if __name__ == "__main__":
    server.run("stdio")
