"""Tools the model can call: where they come from, how one call runs, and the model's own call format.

One module per job:
- spec.py: what a tool is (ToolSpec) and what one call left behind (CallRecord);
- functions.py: `--functions FILE.py`, the public functions of the user's own Python file;
- command_tools.py: `[tools.NAME]` in the config, a command run as an argv list, never through a shell;
- mcp/: `[mcp.NAME]` and `--mcp SPEC`, MCP servers over stdio, Streamable HTTP or SSE (the optional
  `mcp` SDK): their tools, results of every kind, resources and prompts;
- registry.py: every source together, with one namespace;
- approval.py: who may let a call run (a pure decision);
- execute.py: one call run safely (schema check, timeout, output cap, errors as text);
- families.py, call_parsers.py, generic.py, prompt.py: the model's own call format;
- grammar.py: a call's GBNF grammar per family, each tool's arguments held to its schema;
- choice.py: --tool-choice and --chain-limit as a plan per round;
- tools_file.py: `--tools FILE` for `template render|show`;
- offer.py: the tools offered to one session's model, in its call format, with their grammars checked;
- options.py: the tool options of ask, chat and batch as one checked request, and offering it.

Nothing here imports llama_cpp; the tool loop that uses these pieces is one more use of the decode
driver (llmchat.turn.tool_loop).
"""
