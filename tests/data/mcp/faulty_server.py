"""An MCP server over stdio for the error paths (the real SDK's MCPServer, run as a real process).

- `hang`: never answers; writes `started` into MARK_DIR when the call arrives, and `cancelled`
  when the client cancels it (notifications/cancelled);
- `garbage`: writes a line that is not JSON-RPC to stdout, then never answers;
- `fail`: raises, so the result has isError;
- `grow`: adds the tool `grown` and sends notifications/tools/list_changed;
- `ask_person`: asks the client to elicit an answer from a person (llmchat has no one to ask);
- `picture`: returns an image with broken base64.
"""

import os
from pathlib import Path

import anyio
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp_types import ImageContent
from pydantic import BaseModel

server = MCPServer("faulty")
MARKS = Path(os.environ.get("MARK_DIR", "."))


@server.tool()
async def hang() -> str:
    """Never answer."""
    (MARKS / "started").write_text("started", encoding="utf-8")
    try:
        await anyio.sleep_forever()
    except anyio.get_cancelled_exc_class():
        (MARKS / "cancelled").write_text("cancelled", encoding="utf-8")
        raise
    return "unreachable"


@server.tool()
async def garbage() -> str:
    """Break the protocol, then never answer."""
    os.write(1, b"this line is not JSON-RPC\n")
    await anyio.sleep_forever()
    return "unreachable"


@server.tool()
def fail() -> str:
    """Fail."""
    raise RuntimeError("the disk is on fire")


@server.tool()
async def grow(ctx: Context) -> str:
    """Add a tool, and say so."""

    def grown() -> str:
        """A tool that was not there at the start."""
        return "grown"

    server.add_tool(grown)
    await ctx.session.send_tool_list_changed()
    return "added grown"


class Answer(BaseModel):
    name: str


@server.tool()
async def ask_person(ctx: Context) -> str:
    """Ask a person through the client."""
    result = await ctx.elicit("What is your name?", Answer)
    return f"elicitation: {result.action}"


@server.tool()
def picture() -> ImageContent:
    """An image whose data is not base64."""
    return ImageContent(type="image", data="%%% not base64 %%%", mime_type="image/png")


if __name__ == "__main__":
    server.run("stdio")
