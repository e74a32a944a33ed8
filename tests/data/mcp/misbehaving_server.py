"""A hand-written MCP server over stdio (JSON-RPC lines, no SDK) that gets things wrong on purpose,
for the tests of what llmchat does about it (tests/test_mcp_misbehaving.py).

It writes its pid into PID_DIR/server (and, started with `--stubborn`, ignores SIGTERM and the end
of its stdin: only SIGKILL ends it). Its tools:
- `crash`: exits in the middle of the call;
- `hang`: never answers (it writes PID_DIR/called first, so a test can wait for the call);
- `together`: a notification and the answer in one write, flushed once;
- `bad_note`: a `notifications/progress` without its progressToken, then the answer;
- `garbage`: a line that is not JSON, then nothing;
- `echo`: answers "echo".
"""

import json
import os
import signal
import sys
import threading
from pathlib import Path

PID_DIR = Path(os.environ["PID_DIR"])
STUBBORN = "--stubborn" in sys.argv[1:]
TOOL = {"type": "object", "properties": {}}
TOOLS = ["crash", "hang", "together", "bad_note", "garbage", "echo"]


def line(message):
    return json.dumps(message) + "\n"


def answer(request_id, text):
    return line({"jsonrpc": "2.0", "id": request_id, "result": {"content": [{"type": "text", "text": text}]}})


def write(text):
    sys.stdout.write(text)
    sys.stdout.flush()


def serve():
    for raw in sys.stdin:
        message = json.loads(raw)
        method, request_id = message.get("method"), message.get("id")
        if request_id is None:
            continue  # a notification
        if method == "initialize":
            result = {
                "protocolVersion": "2025-11-25",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "misbehaving", "version": "1"},
            }
            write(line({"jsonrpc": "2.0", "id": request_id, "result": result}))
        elif method == "tools/list":
            tools = [{"name": name, "description": name, "inputSchema": TOOL} for name in TOOLS]
            write(line({"jsonrpc": "2.0", "id": request_id, "result": {"tools": tools}}))
        elif method == "tools/call":
            call(message["params"]["name"], request_id)
        else:
            write(line({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": f"no {method}"}}))


def call(name, request_id):
    if name == "crash":
        os._exit(3)
    elif name == "hang":
        (PID_DIR / "called").write_text("called", encoding="utf-8")
    elif name == "together":
        note = line({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "hi"}})
        write(note + answer(request_id, "together"))
    elif name == "bad_note":
        note = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1, "total": 2}}
        write(line(note) + answer(request_id, "noted"))
    elif name == "garbage":
        write("this line is not JSON\n")
    else:
        write(answer(request_id, "echo"))


if __name__ == "__main__":
    (PID_DIR / "server").write_text(str(os.getpid()), encoding="utf-8")
    if STUBBORN:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        threading.Thread(target=serve, daemon=True).start()
        threading.Event().wait()  # past the end of stdin too
    serve()
