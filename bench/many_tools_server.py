"""A generated MCP server (the SDK's MCPServer, stdio) with many tools, like a large SaaS server:
`python bench/many_tools_server.py [COUNT]` (default 200). Each tool acts on one kind of record
with a verb (`pages_search`, `tickets_update`, ...), a two-sentence description and four
parameters with their own descriptions, so its schema costs what real ones do (about 150-200
tokens each). Its answer names the tool and its arguments. Used by bench/lazy_tools.py and
tests/test_lazy_tools.py. (No `from __future__ import annotations`: the SDK reads the annotations.)"""

import json
import sys
from typing import Annotated

from mcp.server.mcpserver import MCPServer
from pydantic import Field

KINDS = ("pages", "tickets", "users", "projects", "invoices", "orders", "files", "comments", "teams", "events")
VERBS = (
    "search", "get", "create", "update", "delete", "archive", "restore", "share", "export", "import",
    "list", "count", "tag", "untag", "move", "copy", "lock", "unlock", "watch", "unwatch",
)  # fmt: skip


def tool_names(count: int) -> list[str]:
    return [
        f"{KINDS[i % len(KINDS)]}_{VERBS[i // len(KINDS) % len(VERBS)]}" + ("" if i < 200 else f"_{i}")
        for i in range(count)
    ]


def make_tool(name: str):
    kind, verb = name.split("_")[:2]

    def tool(
        record_id: Annotated[str, Field(description=f"The id of the {kind[:-1]} record, as the workspace shows it.")],
        limit: Annotated[int, Field(description="The most records to return; at most 100.")] = 10,
        include_archived: Annotated[bool, Field(description="Whether archived records count too.")] = False,
        fields: Annotated[
            list[str] | None, Field(description="Which fields of each record to return; all of them when left out.")
        ] = None,
    ) -> str:
        arguments = {"record_id": record_id, "limit": limit, "include_archived": include_archived, "fields": fields}
        return f"{name}: " + json.dumps(arguments, sort_keys=True)

    description = (
        f"{verb.capitalize()} {kind} in the workspace. Works on the {kind} the caller may see, with the "
        f"workspace's own permissions and audit log."
    )
    return tool, description


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    server = MCPServer("many")
    for name in tool_names(count):
        function, description = make_tool(name)
        server.add_tool(function, name=name, description=description)
    server.run()


if __name__ == "__main__":
    main()
