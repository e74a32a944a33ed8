"""An MCP server over stdio whose tool list changes (the real SDK's MCPServer, run as a real process).

- on start it appends a line to START_LOG (when set): the tests count its starts;
- it offers one tool at a time: `step_one` at the start; calling it removes it, adds `step_two` and
  says so (notifications/tools/list_changed, or a listen stream's event at 2026-07-28) (so a forced `required` call is pinned to the one tool);
- with ONE_STEP set, step_one leaves no tool behind;
- the resource `note://greeting` and the prompt `greet`: read through the same server.
"""

import os

from mcp.server import MCPServer
from mcp.server.mcpserver import Context

server = MCPServer("changing")

if os.environ.get("START_LOG"):
    with open(os.environ["START_LOG"], "a", encoding="utf-8") as log:
        log.write(f"start {os.getpid()}\n")


def step_two() -> str:
    """The second step, offered after the first one ran."""
    return "step two done"


@server.tool()
async def step_one(ctx: Context) -> str:
    """The first step: afterwards only the second step is offered."""
    server.remove_tool("step_one")
    if not os.environ.get("ONE_STEP"):  # set: no tool is left afterwards
        server.add_tool(step_two)
    await ctx.notify_tools_changed()  # the 2026-07-28 revision: on the client's subscriptions/listen
    await ctx.session.send_tool_list_changed()  # earlier ones: the notification as is
    return "step one done"


@server.resource("note://greeting")
def greeting() -> str:
    """A short note."""
    return "Hello from the changing server."


@server.prompt()
def greet(name: str) -> str:
    """Greet someone."""
    return f"Say hello to {name}."


if __name__ == "__main__":
    server.run("stdio")
