"""A hand-written MCP server over stdio (JSON-RPC lines, no SDK), for what the SDK's own server never
does: a malformed message, and a tool list that changes.

It speaks the handshake-era protocol (2025-11-25): `server/discover` is answered "method not
found", so the client falls back to `initialize`.

- `garbage`: answers the call with a line that is not JSON-RPC, and then nothing;
- `grow`: adds the tool `grown`, sends notifications/tools/list_changed, then answers;
- `grown`: answers "grown" (listed only after `grow`).
"""

import json
import sys

TOOL = {"type": "object", "properties": {}}
tools = [
    {"name": "garbage", "description": "Break the protocol.", "inputSchema": TOOL},
    {"name": "grow", "description": "Add a tool.", "inputSchema": TOOL},
]


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def text(request_id, value):
    send({"jsonrpc": "2.0", "id": request_id, "result": {"content": [{"type": "text", "text": value}]}})


for line in sys.stdin:
    message = json.loads(line)
    method, request_id = message.get("method"), message.get("id")
    if request_id is None:
        continue  # a notification
    if method == "initialize":
        send(
            {
                "jsonrpc": "2.0",
                "id": request_id,
                "result": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {"tools": {"listChanged": True}},
                    "serverInfo": {"name": "raw", "version": "1"},
                },
            }
        )
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": request_id, "result": {"tools": tools}})
    elif method == "tools/call" and message["params"]["name"] == "garbage":
        sys.stdout.write("this line is not JSON-RPC\n")
        sys.stdout.flush()
    elif method == "tools/call" and message["params"]["name"] == "grow":
        tools.append({"name": "grown", "description": "Added later.", "inputSchema": TOOL})
        send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        text(request_id, "added grown")
    elif method == "tools/call" and message["params"]["name"] == "grown":
        text(request_id, "grown")
    else:
        send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": f"no method {method}"}})
