"""`llmchat mcp`: MCP servers without a model, for scripting and for debugging a server.

    llmchat mcp list                          # every [mcp.NAME]: started, its counts and roots, or why not
    llmchat mcp tools [SERVER]                # their tools and arguments
    llmchat mcp resources [SERVER]            # resources, and resource templates with their arguments
    llmchat mcp prompts [SERVER]              # prompts with their arguments
    llmchat mcp call SERVER TOOL --args JSON  # one call; the result as the model would get it

SERVER is a config name (`[mcp.NAME]`), or the name of a server given with `--mcp SPEC` (a
command, or an http:// URL; `mcp-server-everything` is `everything`). `--json` prints records.
What a server says (its tools' descriptions, a result) is made terminal-safe on a terminal
(llmchat.edges.safe_text) and written exactly into a pipe.
Exit codes: 0 ok; 1 a server failed or a tool reported an error; 2 usage (an unknown server or
tool, arguments that are not JSON or do not match the tool's schema, a server that cannot start).
Only typer is imported at module level. (No `from __future__ import annotations`: Typer reads the
annotations at run time.)
"""

from typing import TYPE_CHECKING, Any, Callable, List, Optional

import typer

from llmchat.commands.tools import ROOT_HELP  # one wording of --root for every command

if TYPE_CHECKING:
    from llmchat.tools.mcp.config import McpServerConfig

MCP_HELP = (
    'A server for this command only: a command (stdio) or an http:// URL, e.g. --mcp "mcp-server-time" (repeatable).'
)
SERVER_HELP = "A server: its [mcp.NAME] in the config, or the name of one given with --mcp (all of them if left out)."
JSON_HELP = "Print JSON records instead of text."


def _use_roots(folders: Optional[List[str]]) -> None:
    """The client's roots for this command (a --root that is not a folder: exit 2)."""
    from llmchat.tools.mcp.roots import use_roots

    use_roots(folders)


def _servers(env: Any, name: Optional[str], specs: Optional[List[str]]) -> list:
    """The servers a command is about: the config's and --mcp's, or the one named."""
    from llmchat.errors import UsageError
    from llmchat.tools.mcp.config import ad_hoc_server, configured_servers

    servers = dict(configured_servers(env.config))
    for spec in specs or ():
        server = ad_hoc_server(spec, servers)  # the configured one, or a name clash: exit 2
        servers[server.name] = server
    if name is None:
        if not servers:
            raise UsageError(
                "no MCP servers: add an [mcp.NAME] table to the config (llmchat config path), or give --mcp SPEC"
            )
        return list(servers.values())
    if name not in servers:
        known = ", ".join(sorted(servers)) or "none"
        raise UsageError(
            f"no MCP server named {name!r} (configured or given with --mcp: {known}); "
            f'add an [mcp.{name}] table, or give it with --mcp "COMMAND ARGS" or --mcp URL'
        )
    return [servers[name]]


def _connect(env: Any, server: Any) -> Any:
    from llmchat.tools.mcp.connection import McpConnection

    return McpConnection(server, stderr=env.stderr)


def _from_each(env: Any, servers: list, read: Callable[[Any, Any], list]) -> tuple[list, bool]:
    """read(server, connection) for each server. One named server that fails is its error (exit 2
    when it cannot start); among several, a failure is one line on stderr, the others are still
    read, and the command ends with exit 1."""
    from llmchat.errors import LlmchatError

    records: list = []
    failed = False
    for server in servers:
        try:
            with _connect(env, server) as connection:
                records += read(server, connection)
        except LlmchatError as err:
            if len(servers) == 1:
                raise
            env.write_err(f"llmchat: {err}\n")  # a server's words
            failed = True
    return records, failed


def list_command(
    mcp: Optional[List[str]] = typer.Option(None, "--mcp", help=MCP_HELP),
    root: Optional[List[str]] = typer.Option(None, "--root", metavar="DIR", help=ROOT_HELP),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Every configured server (and --mcp's), started in turn: its tools, resources and prompts
    counted and the roots it is told of (what it may reach), or the one line saying why it failed.
    Exit 1 when one failed."""
    import json

    from llmchat.env import current_environment
    from llmchat.errors import LlmchatError
    from llmchat.tools.mcp.roots import reach, server_roots

    env = current_environment()
    _use_roots(root)
    records = []
    reaches = []  # what each may reach, in words
    for server in _servers(env, None, mcp):
        record: dict = {"name": server.name, "transport": server.transport, "target": server.target}
        reaches.append("")
        try:
            record["roots"] = [str(path) for path in server_roots(server)]  # a root that is no folder: failed
            reaches[-1] = reach(server)
            with _connect(env, server) as connection:
                record["tools"] = len(connection.tools)
                record["resources"] = len(connection.list_resources()) + len(connection.list_resource_templates())
                record["prompts"] = len(connection.list_prompts())
                record["status"] = "ok"
        except LlmchatError as err:
            record["status"] = "failed"
            record["error"] = str(err)
        records.append(record)
    if as_json:
        env.stdout.write(json.dumps(records, indent=2, ensure_ascii=False) + "\n")
    else:
        for record, reaches_to in zip(records, reaches):
            if record["status"] == "ok":
                state = f"ok: {record['tools']} tools, {record['resources']} resources, {record['prompts']} prompts"
                state += f"; {reaches_to}"
            else:
                state = f"failed: {record['error']}"
            env.write_out(f"{record['name']}  ({record['transport']} {record['target']})  {state}\n")
    if any(record["status"] != "ok" for record in records):
        raise typer.Exit(1)


def tools_command(
    server: Optional[str] = typer.Argument(None, help=SERVER_HELP),
    mcp: Optional[List[str]] = typer.Option(None, "--mcp", help=MCP_HELP),
    root: Optional[List[str]] = typer.Option(None, "--root", metavar="DIR", help=ROOT_HELP),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Each server's tools as the model is offered them (SERVER_TOOL), with their arguments."""
    import json

    from llmchat.env import current_environment
    from llmchat.tools.describe import describe_parameters

    env = current_environment()
    _use_roots(root)

    def read(config: "McpServerConfig", connection: Any) -> list:
        return [
            {"server": config.name, "name": spec.name, "description": spec.description, "parameters": spec.parameters}
            for spec in connection.tools
        ]

    records, failed = _from_each(env, _servers(env, server, mcp), read)
    if as_json:
        env.stdout.write(json.dumps(records, indent=2, ensure_ascii=False) + "\n")
    else:
        for number, record in enumerate(records):
            lines = [f"{record['name']}  (mcp:{record['server']})"]
            lines += [f"  {line}" for line in (record["description"] or "").strip().splitlines()]
            lines.append("  arguments:" + ("" if record["parameters"].get("properties") else " none"))
            lines += [f"    {line}" for line in describe_parameters(record["parameters"])]
            env.write_out(("\n" if number else "") + "\n".join(lines) + "\n")  # the server's descriptions
    if failed:
        raise typer.Exit(1)


def resources_command(
    server: Optional[str] = typer.Argument(None, help=SERVER_HELP),
    mcp: Optional[List[str]] = typer.Option(None, "--mcp", help=MCP_HELP),
    root: Optional[List[str]] = typer.Option(None, "--root", metavar="DIR", help=ROOT_HELP),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Each server's resources (attach one with -f mcp:SERVER/URI), and its resource templates
    with their arguments."""
    import json
    from dataclasses import asdict

    from llmchat.env import current_environment

    env = current_environment()
    _use_roots(root)

    def read(config: "McpServerConfig", connection: Any) -> list:
        resources = [
            {"server": config.name, "kind": "resource", **asdict(item)} for item in connection.list_resources()
        ]
        templates = connection.list_resource_templates()
        return resources + [{"server": config.name, "kind": "template", **asdict(item)} for item in templates]

    records, failed = _from_each(env, _servers(env, server, mcp), read)
    if as_json:
        env.stdout.write(json.dumps(records, indent=2, ensure_ascii=False) + "\n")
        records = []
    elif not records:
        env.write_err("llmchat: no resources\n")
    for record in records:
        if record["kind"] == "resource":
            head = f"mcp:{record['server']}/{record['uri']}"
        else:
            arguments = ", ".join(record["arguments"]) or "none"
            head = f"mcp:{record['server']}/{record['uri_template']}  (template; arguments: {arguments})"
        details = ", ".join(str(value) for value in (record["name"], record["mime_type"]) if value)
        env.write_out(f"{head}  {details}\n")  # the server's names and descriptions
        if record["description"]:
            env.write_out(f"  {record['description']}\n")
    if failed:
        raise typer.Exit(1)


def prompts_command(
    server: Optional[str] = typer.Argument(None, help=SERVER_HELP),
    mcp: Optional[List[str]] = typer.Option(None, "--mcp", help=MCP_HELP),
    root: Optional[List[str]] = typer.Option(None, "--root", metavar="DIR", help=ROOT_HELP),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Each server's prompts (use one with -p mcp:SERVER/NAME), with their arguments."""
    import json
    from dataclasses import asdict

    from llmchat.env import current_environment

    env = current_environment()
    _use_roots(root)

    def read(config: "McpServerConfig", connection: Any) -> list:
        return [{"server": config.name, **asdict(prompt)} for prompt in connection.list_prompts()]

    records, failed = _from_each(env, _servers(env, server, mcp), read)
    if as_json:
        env.stdout.write(json.dumps(records, indent=2, ensure_ascii=False) + "\n")
        records = []
    elif not records:
        env.write_err("llmchat: no prompts\n")
    for record in records:
        env.write_out(  # the server's names and descriptions
            f"mcp:{record['server']}/{record['name']}"
            + (f"  {record['description']}" if record["description"] else "")
            + "\n"
        )
        for argument in record["arguments"]:
            line = f"  {argument['name']}" + (" (required)" if argument["required"] else "")
            env.write_out(line + (f" - {argument['description']}" if argument["description"] else "") + "\n")
    if failed:
        raise typer.Exit(1)


def call_command(
    server: str = typer.Argument(..., help="The server: its [mcp.NAME], or the name of one given with --mcp."),
    tool: str = typer.Argument(
        ..., help="The tool, as the server names it (echo) or as the model sees it (everything_echo)."
    ),
    args: str = typer.Option("{}", "--args", help='The arguments as a JSON object, e.g. --args \'{"a": 2, "b": 3}\'.'),
    mcp: Optional[List[str]] = typer.Option(None, "--mcp", help=MCP_HELP),
    root: Optional[List[str]] = typer.Option(None, "--root", metavar="DIR", help=ROOT_HELP),
    timeout: Optional[float] = typer.Option(
        None, "--timeout", help="Seconds for the call (default: the server's timeout, else 30)."
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print the result as a JSON record: text, blocks, structured content."
    ),
) -> None:
    """Call one tool with no model: the result, handled as the model would get it, on stdout
    (images and audio saved under the cache, named on stderr). Exit 1 when the tool reports an error."""
    import json

    from llmchat.env import current_environment
    from llmchat.errors import LlmchatError, UsageError
    from llmchat.tools.execute import arguments_error
    from llmchat.tools.spec import DEFAULT_TIMEOUT_S, ToolFailure

    env = current_environment()
    _use_roots(root)
    try:
        arguments = json.loads(args)
    except json.JSONDecodeError as err:
        raise UsageError(
            f"--args is not valid JSON ({err.msg} at column {err.colno}); give an object, e.g. '{{}}'"
        ) from None
    if not isinstance(arguments, dict):
        raise UsageError(f"--args must be a JSON object, not {type(arguments).__name__}")
    (config,) = _servers(env, server, mcp)
    if timeout is not None and timeout <= 0:
        raise UsageError("--timeout must be a number of seconds above 0")
    with _connect(env, config) as connection:
        specs = {spec.name: spec for spec in connection.tools}
        prefixed = tool if tool in specs else f"{config.name}_{tool}"
        remote = prefixed[len(config.name) + 1 :]
        if remote in connection.left_out:
            raise UsageError(f"{prefixed}: {connection.left_out[remote]}")
        if prefixed not in specs:
            known = ", ".join(name[len(config.name) + 1 :] for name in specs) or "none"
            raise UsageError(f"MCP server {config.name} has no tool {tool!r} (its tools: {known})")
        problem = arguments_error(specs[prefixed], arguments)
        if problem:
            raise UsageError(f"{problem}; see llmchat mcp tools {config.name}")
        try:
            handled = connection.call_handled(remote, arguments, timeout or config.timeout_s or DEFAULT_TIMEOUT_S)
        except ToolFailure as err:
            raise LlmchatError(f"{prefixed}: {err}") from None
    if as_json:
        env.stdout.write(json.dumps(handled.record(), ensure_ascii=False) + "\n")
    elif not handled.is_error:  # the tool's result: on a terminal made terminal-safe, piped exact
        env.write_out(handled.text + ("" if handled.text.endswith("\n") else "\n"))
    if handled.is_error:
        first = handled.text.strip().splitlines()[0] if handled.text.strip() else "no details"
        env.write_err(f"llmchat: {prefixed} reported an error: {first}\n")
        raise typer.Exit(1)
