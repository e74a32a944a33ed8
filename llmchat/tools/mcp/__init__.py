"""MCP servers as tool sources, and their resources and prompts (the official `mcp` SDK, imported
only when a server is used: `pip install 'llmchat[mcp]'`).

- config.py: `[mcp.NAME]` tables and `--mcp SPEC` (a command for stdio, or a URL for Streamable
  HTTP or SSE) as McpServerConfig; `server_named(config, NAME)` and `parse_mcp_spec(SPEC)` name one.
- transports.py: the transport for a server (stdio, Streamable HTTP, SSE), with its timeouts.
- stdio.py: a stdio server started in a process group of its own and ended whole, within a second.
- sdk_logs.py: what the SDK logs, as one line about the server (never a traceback), or nothing.
- connection.py: McpConnection, one running server: tools as ToolSpecs named SERVER_TOOL, calls,
  resources, resource templates, prompts; a changed tool list seen (list_changed, or at
  2026-07-28 a subscriptions/listen stream).
- failures.py: McpServerDown (could not start: a chat goes on without it), McpFailure, and the
  one-line reason for what the SDK raised.
- results.py: every content kind of a result as text for the model (media saved under the cache).
- catalog.py: resources and prompts as small frozen values.
- progress.py: a call's progress notifications as one line on stderr.
- roots.py: the client's roots (each --root, and the server's own roots = [...]) for `roots/list`.
- elicitation.py, form.py, desk.py: a server's `elicitation/create` (form or URL) asked of the
  person (llmchat.edges.person), on the thread that waits for the call; declined at once where nobody is
  there, or where no call waits (desk.NobodyWaits).

Open one server without a model:

    with McpConnection(server_named(config, "everything")) as server:   # or parse_mcp_spec(SPEC)
        server.list_resources(); server.read_resource(uri); server.get_prompt(name, {"city": "Paris"})
"""
