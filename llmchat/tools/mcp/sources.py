"""MCP resources and prompts used in a conversation: `mcp:SERVER/URI` attached like a file, and
`mcp:SERVER/NAME` applied as a prompt.

    llmchat ask --mcp mcp-server-everything -f mcp:everything/demo://resource/static/document/features.md "Summarise"
    llmchat ask -p mcp:everything/args-prompt --prompt-arg city=Paris
    /file mcp:everything/demo://resource/dynamic/text/3     /prompt mcp:everything/args-prompt city=Paris

SERVER is an `[mcp.SERVER]` of the config, or a server given with `--mcp` on the same command
(named after its program: `mcp-server-everything` is `everything`). A server the run's tools
started (the ToolSet given as `shared`) is read through that same connection: one start per
server, and one that could not start is the usage error it was (the user asked for its content).
Any other server is started at its first use, its tools not listed, and stopped with the
McpSources (close()).

- A resource becomes an Attachment named `mcp:SERVER/URI`: its bytes (a text, or a blob's bytes)
  are checked, wrapped, counted and stored like a local file's (llmchat.turn.attachments), and cross
  the same trust boundary. A binary resource is refused, as a binary file is.
- A prompt's messages (user messages; their text, an embedded resource's text, a placeholder for
  media) become the opening of the next user message, a blank line apart, before what is typed.
  A required argument not given is asked for (llmchat.edges.person), and a usage error where nobody is
  there to answer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

from llmchat.errors import UsageError

if TYPE_CHECKING:
    from llmchat.config import Config
    from llmchat.edges.person import Person
    from llmchat.tools.mcp.catalog import PromptInfo, ResourceInfo, ResourceTemplateInfo
    from llmchat.tools.mcp.config import McpServerConfig
    from llmchat.tools.mcp.connection import McpConnection
    from llmchat.tools.registry import ToolSet

MCP_REF = "mcp:"

# (argument name, its description or None) -> the value typed, or None at the end of input.
AskArgument = Callable[[str, str | None], str | None]


def is_mcp_ref(text: str) -> bool:
    return text.startswith(MCP_REF)


@dataclass(frozen=True)
class McpRef:
    """`mcp:SERVER/TARGET`: a resource URI or a prompt name on one server."""

    server: str
    target: str

    def __str__(self) -> str:
        return f"{MCP_REF}{self.server}/{self.target}"


def parse_ref(text: str, what: str) -> McpRef:
    """`mcp:SERVER/URI` or `mcp:SERVER/NAME` (`what` names the part after the slash for the message)."""
    server, slash, target = text[len(MCP_REF) :].partition("/")
    if not is_mcp_ref(text) or not server or not slash or not target:
        raise UsageError(f"{text}: write mcp:SERVER/{what} (SERVER from the config's [mcp.SERVER] or --mcp)")
    return McpRef(server, target)


def parse_prompt_args(pairs: Sequence[str]) -> dict[str, str]:
    """`--prompt-arg k=v` (repeatable), or `/prompt mcp:S/N k=v ...`."""
    arguments: dict[str, str] = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals or not key.strip():
            raise UsageError(f"prompt argument {pair!r}: write NAME=VALUE (e.g. city=Paris)")
        arguments[key.strip()] = value
    return arguments


def joined(opening: str, typed: str) -> str:
    """The user message: a prompt's text, then what was typed, a blank line apart."""
    return f"{opening}\n\n{typed}" if opening and typed else opening or typed


def argument_asker(person: Person) -> AskArgument | None:
    """Ask the person for a missing prompt argument (None where nobody is there: then a missing
    required argument is a usage error). No answer (Ctrl-C, the end of input) answers nothing."""
    if not person.present():
        return None

    def ask(name: str, description: str | None) -> str | None:
        return person.ask(name + (f" ({description})" if description else "") + ": ")

    return ask


class McpSources:
    """The MCP servers a run reads resources and prompts from, started on first use."""

    def __init__(
        self,
        config: Config,
        mcp_specs: Sequence[str] = (),
        *,
        stderr: IO[str] | None = None,
        shared: ToolSet | None = None,
        saved_conversation: bool = True,
    ):
        self._config = config
        self._stderr = stderr
        self._saved_conversation = saved_conversation  # False: images of an unsaved chat go at exit
        self._shared = shared  # the run's tools: their servers are read through, never closed here
        self._ad_hoc: dict[str, McpServerConfig] = {}
        if mcp_specs:  # the MCP configuration's module only where MCP is used (0.13 MiB of a one-shot)
            from llmchat.tools.mcp.config import ad_hoc_server, configured_servers

            configured = configured_servers(config)
            for spec in mcp_specs:
                server = ad_hoc_server(spec, configured)
                self._ad_hoc[server.name] = server
        self._open: dict[str, McpConnection] = {}
        self._stack = ExitStack()

    def __enter__(self) -> McpSources:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._open.clear()
        self._stack.close()

    def server_names(self) -> list[str]:
        """The servers a reference may name: the config's, then those of --mcp."""
        tables = getattr(self._config, "mcp", None) or {}
        return sorted(set(tables) | set(self._ad_hoc))

    def running(self, name: str) -> McpConnection | None:
        """The server NAME if it runs already, else None: never started here (Tab completion asks,
        and a keypress must not start a server)."""
        if name in self._open:
            return self._open[name]
        if self._shared is None or name in self._shared.down:
            return None
        return self._shared.connection(name)

    def connection(self, name: str) -> McpConnection:
        """The running server NAME (started now if it is not yet)."""
        if name in self._open:
            return self._open[name]
        running = self._shared.connection(name) if self._shared is not None else None  # McpServerDown: said
        if running is not None:
            return running
        from llmchat.tools.mcp.config import configured_servers
        from llmchat.tools.mcp.connection import McpConnection

        server = self._ad_hoc.get(name) or configured_servers(self._config).get(name)
        if server is None:
            known = ", ".join(self.server_names()) or "none: add an [mcp.NAME] table to the config, or --mcp"
            raise UsageError(f"no MCP server named {name!r} (known: {known})")
        connection = self._stack.enter_context(
            McpConnection(server, stderr=self._stderr, lists_tools=False, saved_conversation=self._saved_conversation)
        )
        self._open[name] = connection
        return connection

    # --- resources -------------------------------------------------------------------------------

    def resource_bytes(self, text: str) -> bytes:
        """The content of the resource `mcp:SERVER/URI`: its text, or a blob's bytes, parts a newline
        apart. llmchat.turn.attachments checks it as it checks a file's bytes (binary and non-UTF-8
        content is refused)."""
        ref = parse_ref(text, "URI")
        parts = []
        for part in self.connection(ref.server).read_resource(ref.target):
            parts.append(part.data if part.data is not None else part.text.encode("utf-8"))
        return b"\n".join(parts)

    def resources(
        self, server: str | None = None
    ) -> list[tuple[str, tuple[ResourceInfo, ...], tuple[ResourceTemplateInfo, ...]]]:
        """(server, resources, resource templates) for SERVER, or for every known server."""
        names = [server] if server else self.server_names()
        found = []
        for name in names:
            connection = self.connection(name)
            found.append((name, connection.list_resources(), connection.list_resource_templates()))
        return found

    # --- prompts ---------------------------------------------------------------------------------

    def prompts(self, server: str | None = None) -> list[tuple[str, tuple[PromptInfo, ...]]]:
        names = [server] if server else self.server_names()
        return [(name, self.connection(name).list_prompts()) for name in names]

    def opening(self, prompt: str | None, pairs: Sequence[str], ask: AskArgument | None) -> str:
        """`-p mcp:SERVER/NAME --prompt-arg k=v`: the prompt's text ("" for no MCP prompt; a
        `-p NAME` of the config is llmchat.startup.saved_prompts')."""
        if prompt is None or not is_mcp_ref(prompt):
            if pairs:
                raise UsageError("--prompt-arg goes with -p mcp:SERVER/NAME (the arguments of an MCP prompt)")
            return ""
        return self.prompt_text(prompt, parse_prompt_args(pairs), ask)

    def prompt_text(self, text: str, arguments: Mapping[str, str], ask: AskArgument | None = None) -> str:
        """The prompt `mcp:SERVER/NAME` with `arguments`, as the opening of a user message. A
        required argument not given is asked for (`ask`: a terminal), else a UsageError."""
        ref = parse_ref(text, "NAME")
        connection = self.connection(ref.server)
        listed = {prompt.name: prompt for prompt in connection.list_prompts()}
        prompt = listed.get(ref.target)
        if prompt is None:
            known = ", ".join(sorted(listed)) or "none"
            raise UsageError(f"{ref}: {ref.server} has no prompt named {ref.target!r} (its prompts: {known})")
        arguments = dict(arguments)
        names = [argument.name for argument in prompt.arguments]
        unknown = [key for key in arguments if key not in names]
        if unknown:
            raise UsageError(f"{ref} takes no argument {unknown[0]!r} (its arguments: {', '.join(names) or 'none'})")
        for argument in prompt.arguments:
            if not argument.required or argument.name in arguments:
                continue
            value = ask(argument.name, argument.description) if ask is not None else None
            if value is None:
                detail = f" ({argument.description})" if argument.description else ""
                raise UsageError(
                    f"{ref} needs the argument {argument.name}{detail}; pass --prompt-arg {argument.name}=VALUE"
                )
            arguments[argument.name] = value
        messages = connection.get_prompt(prompt.name, arguments)
        roles = sorted({message.role for message in messages} - {"user"})
        if roles:
            raise UsageError(
                f"{ref} has {', '.join(roles)} messages; llmchat applies prompts made of user messages only"
            )
        return "\n\n".join(message.text for message in messages if message.text)


def listing_lines(sources: McpSources, what: str, server: str | None = None) -> list[str]:
    """`/resources` and `/prompts`: one line per resource, template or prompt, with its arguments."""
    lines: list[str] = []
    if what == "resources":
        for name, resources, templates in sources.resources(server):
            lines += [f"mcp:{name}/{r.uri}" + (f"  {r.mime_type}" if r.mime_type else "") for r in resources]
            lines += [
                f"mcp:{name}/{t.uri_template}  template, arguments: {', '.join(t.arguments) or 'none'}"
                for t in templates
            ]
    else:
        for name, prompts in sources.prompts(server):
            for prompt in prompts:
                arguments = ", ".join(a.name + ("" if a.required else "?") for a in prompt.arguments)
                about = f"  {prompt.description}" if prompt.description else ""
                lines.append(f"mcp:{name}/{prompt.name} ({arguments}){about}")
    return lines
