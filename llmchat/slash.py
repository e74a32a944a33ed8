"""Slash commands of the interactive chat: the table, the handlers and the completer.

Everything here works without a terminal: a handler gets a `CommandContext` (the session, a rich
Console for what the user asked to see, a function for one-line errors and hints) and returns an
`Outcome` telling the chat loop to go on, to exit, or to run a turn with some text (`/retry`).

Command output is user-facing content, so it goes to stdout; errors and hints go to stderr.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, TypeVar

from prompt_toolkit.completion import CompleteEvent, Completer, Completion

from llmchat.errors import HistoryError, LlmchatError
from llmchat.sampling import PRESETS, SETTABLE, with_setting

if TYPE_CHECKING:
    from prompt_toolkit.document import Document
    from rich.console import Console

    from llmchat.sampling import SamplingParams
    from llmchat.session import ChatSession
    from llmchat.store.attachment_records import Attachment
    from llmchat.store.history import HistoryStore

T = TypeVar("T")

HISTORY_OFF = "history is off for this chat (--no-history, `history = false`, or the store failed); nothing is saved"


class Action(Enum):
    CONTINUE = "continue"  # back to the prompt
    EXIT = "exit"  # leave the chat
    TURN = "turn"  # send `Outcome.text` to the model
    EDIT = "edit"  # put `Outcome.text` back at the prompt, to change and send (/edit)


@dataclass(frozen=True)
class Outcome:
    action: Action = Action.CONTINUE
    text: str | None = None
    # The files a TURN's text goes with (/retry: those of the message sent again); None: the pending ones.
    attachments: tuple[Attachment, ...] | None = None


CONTINUE = Outcome()
EXIT = Outcome(Action.EXIT)


@dataclass
class CommandContext:
    session: ChatSession
    out: Console  # on stdout
    error: Callable[[str], None]  # one line on stderr: errors and hints
    info: Callable[[str], None] = field(default=lambda message: None)  # one dim line on stderr: confirmations
    attachments: list[Attachment] = field(default_factory=list)  # /file: for the next message


# --------------------------------------------------------------------------- shared with the chat loop


def _write_history(ctx: CommandContext, work: Callable[[HistoryStore], T]) -> T | None:
    """Run a history write; on HistoryError, turn the history off (once) and return None."""
    store = ctx.session.history
    if store is None:
        return None
    try:
        return work(store)
    except HistoryError as err:
        ctx.error(ctx.session.disable_history(err, "this chat goes on without saving to the history"))
        return None


def split_command(line: str) -> tuple[str, str]:
    """'/set temperature 0.2' -> ('/set', 'temperature 0.2'). The name is case-insensitive."""
    stripped = line.strip()
    name, _, rest = stripped.partition(" ")
    if "\n" in name:  # '/system\nline two' : the newline separates like a space
        name, _, more = name.partition("\n")
        rest = more + (" " + rest if rest else "")
    return name.lower(), rest.strip()


def is_command(line: str) -> bool:
    """A line starting with one slash is a command; `//text` sends `/text` as a message."""
    stripped = line.lstrip()
    return stripped.startswith("/") and not stripped.startswith("//")


def unescape_message(line: str) -> str:
    """`//etc/hosts is ...` -> `/etc/hosts is ...` (the escape for messages that start with a slash)."""
    stripped = line.lstrip()
    return stripped[1:] if stripped.startswith("//") else line


# --------------------------------------------------------------------------- handlers


def cmd_help(ctx: CommandContext, arg: str) -> Outcome:
    from rich.table import Table

    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for command in COMMANDS.values():
        if command.name in ALIASES:
            continue
        usage = command.name + (f" {command.args}" if command.args else "")
        table.add_row(usage, command.help)
    ctx.out.print(table)
    ctx.out.print(
        "Enter sends · Alt-Enter (or Esc then Enter) adds a line · pasted text stays one message\n"
        "Ctrl-C stops a reply or clears the line; twice on an empty line exits · Ctrl-D exits\n"
        "Start a message with // to send text that begins with a slash",
        highlight=False,
    )
    return CONTINUE


def cmd_exit(ctx: CommandContext, arg: str) -> Outcome:
    return EXIT


def cmd_clear(ctx: CommandContext, arg: str) -> Outcome:
    ctx.session.new_conversation()
    ctx.info("new conversation (the system prompt and settings are kept)")
    return CONTINUE


def cmd_tools(ctx: CommandContext, arg: str) -> Outcome:
    """The tools offered to the model (-T, --functions, --mcp): name, source, arguments."""
    offer = ctx.session.tools
    if offer is None or not offer.specs:
        ctx.error("no tools in this chat; start it with -T NAME, --functions FILE.py or --mcp COMMAND")
        return CONTINUE
    from llmchat.tools.describe import describe_parameters

    state = "on" if offer.active else "off (/tool on offers them again)"
    ctx.out.print(f"tools {state}; call format: {offer.family.label}", markup=False, highlight=False)
    for spec in offer.listed():
        always = ", runs without asking" if spec.approve == "always" or spec.name in offer.policy.always else ""
        ctx.out.print(f"{spec.name}  ({spec.source}{always})", markup=False, highlight=False)
        if spec.description:
            ctx.out.print(f"  {spec.description.strip().splitlines()[0]}", markup=False, highlight=False)
        for line in describe_parameters(spec.parameters):
            ctx.out.print(f"    {line}", markup=False, highlight=False)
    return CONTINUE


def cmd_tool(ctx: CommandContext, arg: str) -> Outcome:
    """`/tool on|off`: offer the tools to the model from the next message, or not."""
    offer = ctx.session.tools
    if offer is None or not offer.specs:
        ctx.error("no tools in this chat; start it with -T NAME, --functions FILE.py or --mcp COMMAND")
        return CONTINUE
    word = arg.strip().lower()
    if word not in ("on", "off"):
        ctx.error("/tool on or /tool off")
        return CONTINUE
    offer.enabled = word == "on"
    if offer.enabled and offer.choice.mode == "none":
        from llmchat.tools.choice import ToolChoice

        offer.choice = ToolChoice("auto")
    ctx.info(f"tools {word} from the next message")
    return CONTINUE


def _thinking(on: bool) -> Callable[[CommandContext, str], Outcome]:
    def command(ctx: CommandContext, arg: str) -> Outcome:
        session = ctx.session
        if session.reasoning_format is None:
            ctx.error("this model's template has no thinking mode; /think and /nothink do nothing here")
            return CONTINUE
        said: list[str] = []
        session.set_thinking(on, said.append)
        for line in said:  # what the template cannot do (it has no switch), said once
            ctx.error(line)
        if not said:
            ctx.info(f"thinking {'on' if on else 'off'} from the next message")
        return CONTINUE

    return command


def cmd_system(ctx: CommandContext, arg: str) -> Outcome:
    session = ctx.session
    if not arg:
        current = session.conversation.system
        if current:
            ctx.out.print(current, markup=False, highlight=False)
        else:
            ctx.info("no system prompt; set one with /system TEXT")
        return CONTINUE
    new = None if arg == "--clear" else arg
    try:
        session.with_system(new)
    except HistoryError as err:
        # with_system changes the conversation first, then the store: the chat keeps the new prompt.
        ctx.error(session.disable_history(err, "this chat goes on without saving to the history"))
    ctx.info("system prompt cleared" if new is None else "system prompt set")
    return CONTINUE


def cmd_set(ctx: CommandContext, arg: str) -> Outcome:
    parts = arg.split(None, 1)
    if len(parts) != 2:
        ctx.error(f"usage: /set KEY VALUE, KEY one of: {', '.join(SETTABLE)}, preset")
        return CONTINUE
    key, value = parts[0].lower().replace("-", "_"), parts[1].strip()
    if key == "temp":
        key = "temperature"
    session = ctx.session
    try:
        session.set_sampling(with_setting(session.sampling, key, value))
    except LlmchatError as err:
        ctx.error(f"error: {err}")
        return CONTINUE
    if key == "preset":
        ctx.info(f"preset {value}: " + ", ".join(f"{k}={_value(session.sampling, k)}" for k in PRESETS[value]))
    else:
        ctx.info(f"{key} = {_value(session.sampling, key)}")
    return CONTINUE


def _value(sampling: SamplingParams, name: str) -> str:
    value = getattr(sampling, name)
    if value is None:
        from llmchat.session import DEFAULT_REPLY_CAP

        return {
            "seed": "random (a fresh seed per reply)",
            "max_tokens": f"{DEFAULT_REPLY_CAP} (the default reply cap; less when the context has less room)",
        }.get(name, "none")
    return f"{value:g}" if isinstance(value, float) else str(value)


def cmd_show(ctx: CommandContext, arg: str) -> Outcome:
    from rich.table import Table

    session = ctx.session
    template = session.template
    limit = session.engine.n_ctx
    used = session.context_used()
    budget = session.budget()
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    table.add_column(style="dim")
    info = session.engine.info
    origins = getattr(session, "origins", {})
    table.add_row("model", session.model_label, _with_origin(info.model_path, origins.get("model")))
    table.add_row("template", template.name, f"from {template.source_detail or template.source}")
    table.add_row(
        "context",
        f"{used:,} / {limit:,} tokens used",
        f"prompts up to {budget.prompt_limit:,}, {budget.reply_reserve:,} kept for the reply",
    )
    for row in info.rows:  # the engine's own: flash attention, threads, drafting; or the server's
        table.add_row(*row)
    if session.engine.caps.disk_cache:
        disk = session.kv_store
        table.add_row(
            "KV on disk",
            "on" if disk is not None else "off",
            f"{disk.folder}, at most {disk.max_bytes / 1024**3:.1f} GiB" if disk is not None else "",
        )
    system = session.conversation.system
    table.add_row("system", _one_line(system) if system else "(none)", origins.get("system", ""))
    if origins.get("schema"):
        table.add_row("schema", "the reply is held to a schema", origins["schema"])
    count = f"{len(session.conversation.messages)} messages"
    fork = session.fork_from
    if session.history is None:
        saved = "not saved (history off)"
    elif session.conversation_id is None and fork is not None:
        saved = f"branch of {fork[0]}"
        count = f"shares turns 1..{fork[1]}; saved with its first reply; " + count
    elif session.conversation_id is None:
        saved = "not saved yet (saved after the first reply)"
    else:
        saved = session.conversation_id
    table.add_row("conversation", saved, count)
    sampling = session.sampling
    table.add_row("sampling", f"preset {sampling.preset}", "")
    for name in SETTABLE:
        table.add_row(f"  {name}", _value(sampling, name), sampling.source_of(name))
    if sampling.stop:
        table.add_row("  stop", ", ".join(repr(s) for s in sampling.stop), "flag")
    table.add_row("  loop stop", "on" if sampling.stop_loops else "off", "--no-loop-stop turns it off")
    ctx.out.print(table, markup=False, highlight=False)
    return CONTINUE


def _with_origin(detail: str, origin: str | None) -> str:
    return f"{detail} ({origin})" if origin else detail


def cmd_prompt(ctx: CommandContext, arg: str) -> Outcome:
    from llmchat.saved_prompts import apply_to_session

    if not arg:
        config = getattr(ctx.session, "config", None)
        known = ", ".join(sorted(config.prompts)) if config is not None and config.prompts else "none yet"
        ctx.error(f"usage: /prompt NAME (saved prompts: {known}; see llmchat prompts list)")
        return CONTINUE
    try:
        lines = apply_to_session(ctx.session, arg)
    except HistoryError as err:  # the system prompt is set; only its save failed
        ctx.error(ctx.session.disable_history(err, "this chat goes on without saving to the history"))
        return CONTINUE
    except LlmchatError as err:
        ctx.error(f"error: {err}")
        return CONTINUE
    for line in lines:
        ctx.info(line)
    return CONTINUE


def cmd_file(ctx: CommandContext, arg: str) -> Outcome:
    from llmchat.attachments import check_room, collect, count_line

    if not arg:
        ctx.error("usage: /file PATH (a file, a glob or a folder; Tab completes paths)")
        return CONTINUE
    try:
        found = [a for a in collect([arg]) if a not in ctx.attachments]
        # The room left counts the files already pending: together they must fit.
        counts = check_room(ctx.session, [*ctx.attachments, *found])[len(ctx.attachments) :]
    except LlmchatError as err:
        ctx.error(f"error: {err}")
        return CONTINUE
    ctx.attachments.extend(found)
    for attachment, count in zip(found, counts):
        ctx.info(count_line(attachment, count, ctx.session.engine.n_ctx))
    if found:
        ctx.info("attached to your next message (/files lists them, /drop removes them)")
    return CONTINUE


def cmd_files(ctx: CommandContext, arg: str) -> Outcome:
    from llmchat.attachments import count_line, tokens_of

    if not ctx.attachments:
        ctx.info("no files attached; /file PATH attaches one to the next message")
        return CONTINUE
    for attachment in ctx.attachments:
        tokens, _ = tokens_of(ctx.session, attachment)
        ctx.out.print(count_line(attachment, tokens, ctx.session.engine.n_ctx), markup=False, highlight=False)
    return CONTINUE


def cmd_drop(ctx: CommandContext, arg: str) -> Outcome:
    if not ctx.attachments:
        ctx.info("no files attached")
        return CONTINUE
    if not arg:
        dropped = [a.path for a in ctx.attachments]
        ctx.attachments.clear()
    else:
        dropped = [a.path for a in ctx.attachments if a.path == arg]
        if not dropped:
            ctx.error(f"{arg} is not attached; /files lists what is")
            return CONTINUE
        ctx.attachments[:] = [a for a in ctx.attachments if a.path != arg]
    ctx.info("dropped " + ", ".join(dropped))
    return CONTINUE


def _one_line(text: str, width: int = 70) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def cmd_stats(ctx: CommandContext, arg: str) -> Outcome:
    from rich.table import Table

    result = ctx.session.last_result
    if result is None:
        ctx.info("no reply yet in this conversation")
        return CONTINUE
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(justify="right")
    for key, value in result.stats.to_dict().items():
        table.add_row(key, f"{value:g}" if isinstance(value, float) else str(value))
    table.add_row("seed", str(result.seed))
    ctx.out.print(table, highlight=False)
    return CONTINUE


def _drop_last_exchange(ctx: CommandContext) -> tuple[str, tuple[Attachment, ...]] | None:
    """Remove the last exchange (the last user message and everything after it: a tool turn's
    calls and results, the reply, interrupted or not) from the conversation and the history.
    Returns the user message as typed and the files it carried, or None when there was nothing."""
    from llmchat.branches import keep_turns, last_user_turn, turn_starts

    session = ctx.session
    start = session.conversation.last_exchange_start()
    if start is None:
        return None
    try:
        last = last_user_turn(session)
    except HistoryError:  # its files could not be looked up: the message as it was sent
        last = None
    typed, files = last or (session.conversation.messages[start]["content"], ())
    if session.fork_from is not None:  # a branch not saved yet: fork one turn earlier
        keep_turns(session, len(turn_starts(session.conversation)) - 1)
        return typed, files
    session.conversation.drop_last_exchange()
    conversation_id = session.conversation_id
    if conversation_id is not None:
        _write_history(ctx, lambda store: store.delete_last_exchange(conversation_id))
    session.last_result = None
    return typed, files


def cmd_undo(ctx: CommandContext, arg: str) -> Outcome:
    dropped = _drop_last_exchange(ctx)
    if dropped is None:
        ctx.error("nothing to undo")
    else:
        ctx.info(f"removed the last exchange ({_one_line(dropped[0], 50)!r} and its reply)")
    return CONTINUE


def cmd_retry(ctx: CommandContext, arg: str) -> Outcome:
    """The last message sent again, with the files it carried (files attached since wait for the next)."""
    dropped = _drop_last_exchange(ctx)
    if dropped is None:
        ctx.error("nothing to retry: send a message first")
        return CONTINUE
    typed, files = dropped
    return Outcome(Action.TURN, typed, attachments=files)


def cmd_edit(ctx: CommandContext, arg: str) -> Outcome:
    from llmchat.branches import keep_turns, last_user_turn, turn_starts

    session = ctx.session
    try:
        last = last_user_turn(session)
    except HistoryError as err:
        ctx.error(f"error: {err}")
        return CONTINUE
    if last is None:
        ctx.error("nothing to edit: send a message first")
        return CONTINUE
    typed, files = last
    turns = len(turn_starts(session.conversation))
    saved = session.conversation_id or (session.fork_from or (None,))[0]
    keep_turns(session, turns - 1)
    ctx.attachments[:] = list(files)  # the files it carried go with the edited message
    if saved is not None and session.history is not None:
        ctx.info(
            f"editing turn {turns}: the old exchange stays in {saved}; sending starts a branch at turn {turns - 1}"
        )
    else:
        ctx.info(f"editing turn {turns}")
    return Outcome(Action.EDIT, typed)


def cmd_branch(ctx: CommandContext, arg: str) -> Outcome:
    from llmchat.branches import keep_turns, turn_starts

    session = ctx.session
    turns = len(turn_starts(session.conversation))
    try:
        at = int(arg) if arg else turns
    except ValueError:
        ctx.error(f"usage: /branch [N], N a turn number 0..{turns}, got {arg!r}")
        return CONTINUE
    if not 0 <= at <= turns:
        ctx.error(f"this conversation has {turns} turns; /branch N takes 0..{turns}")
        return CONTINUE
    parent = session.conversation_id or (session.fork_from or (None,))[0]
    keep_turns(session, at)
    if parent is not None and session.history is not None:
        ctx.info(f"new branch of {parent} sharing turns 1..{at}; it is saved with its first reply")
    else:
        ctx.info(f"kept turns 1..{at}; the rest is dropped (history is off, so nothing else keeps it)")
    return CONTINUE


def cmd_save(ctx: CommandContext, arg: str) -> Outcome:
    session = ctx.session
    if session.history is None:
        ctx.error(HISTORY_OFF)
        return CONTINUE
    conversation_id = session.conversation_id
    if conversation_id is None:
        ctx.error("nothing saved yet: a conversation is stored after its first reply")
        return CONTINUE
    if not arg:
        ctx.info(
            f"this conversation is saved as {conversation_id} (each turn is saved as it ends); /save NAME names it"
        )
        return CONTINUE
    try:
        _write_history(ctx, lambda store: store.rename(conversation_id, arg))
    except LlmchatError as err:  # the name is taken or reserved
        ctx.error(f"error: {err}")
        return CONTINUE
    if session.history is not None:  # None: the write failed and the history is off (said once)
        ctx.info(f"saved as {arg!r} ({session.conversation_id}); /load {arg} continues it later")
    return CONTINUE


def cmd_load(ctx: CommandContext, arg: str) -> Outcome:
    session = ctx.session
    if session.history is None:
        ctx.error(HISTORY_OFF)
        return CONTINUE
    if not arg:
        ctx.error("usage: /load NAME|ID (see /history)")
        return CONTINUE
    try:
        stored = session.history.get(arg)
    except LlmchatError as err:
        ctx.error(f"error: {err}")
        return CONTINUE
    session.load_conversation(stored)
    session.last_result = None
    label = f"{stored.name!r} ({stored.id})" if stored.name else stored.id
    ctx.info(f"loaded {label}: {len(session.conversation.messages)} messages")
    last_user = session.conversation.last_user_message()
    if last_user is not None:
        ctx.info(f"last message: {_one_line(last_user, 60)!r}")
    return CONTINUE


def cmd_history(ctx: CommandContext, arg: str) -> Outcome:
    from rich.table import Table

    session = ctx.session
    if session.history is None:
        ctx.error(HISTORY_OFF)
        return CONTINUE
    try:
        limit = int(arg) if arg else 10
    except ValueError:
        ctx.error(f"usage: /history [N], N a number, got {arg!r}")
        return CONTINUE
    try:
        summaries = session.history.list_conversations(limit=max(limit, 1))
    except LlmchatError as err:
        ctx.error(f"error: {err}")
        return CONTINUE
    if not summaries:
        ctx.info("no saved conversations yet")
        return CONTINUE
    headers = ("", "ID", "Name", "Updated (UTC)", "Msgs")
    rows = [
        (
            "*" if s.id == session.conversation_id else "",
            s.id,
            s.name or "",
            s.updated_at[:16].replace("T", " "),
            str(s.n_messages),
        )
        for s in summaries
    ]
    # Ids are what /load takes: those columns never clip; only the preview gives way.
    fixed = sum(max(len(text) for text in column) for column in zip(headers, *rows)) + 2 * len(headers)
    room = ctx.out.width - fixed
    show_preview = room >= 12
    table = Table(box=None, header_style="bold", pad_edge=False)
    for header in headers:
        table.add_column(header, no_wrap=True, justify="right" if header == "Msgs" else "left")
    if show_preview:
        longest = max(len("First message"), *(len(s.preview) for s in summaries))
        table.add_column("First message", no_wrap=True, overflow="ellipsis", width=min(room, longest))
    for row, summary in zip(rows, summaries):
        table.add_row(*row, *([summary.preview] if show_preview else []))
    ctx.out.print(table, markup=False, highlight=False)
    marked = any(row[0] for row in rows)
    ctx.info(("* marks this conversation · " if marked else "") + "/load ID|NAME continues one")
    return CONTINUE


# --------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Command:
    name: str
    args: str
    help: str
    handler: Callable[[CommandContext, str], Outcome]


def _table(commands: Iterable[Command]) -> dict[str, Command]:
    return {command.name: command for command in commands}


COMMANDS: dict[str, Command] = _table(
    [
        Command("/help", "", "this list", cmd_help),
        Command("/exit", "", "leave the chat (also /quit, Ctrl-D)", cmd_exit),
        Command("/quit", "", "leave the chat", cmd_exit),
        Command("/clear", "", "start a new conversation; the old one is kept, not deleted", cmd_clear),
        Command("/system", "[TEXT|--clear]", "show or set the system prompt", cmd_system),
        Command("/think", "", "a reasoning model thinks before it answers (its template's switch)", _thinking(True)),
        Command("/nothink", "", "a reasoning model answers without thinking, if its template can", _thinking(False)),
        Command("/prompt", "NAME", "apply a saved prompt: system prompt, preset, sampling, schema", cmd_prompt),
        Command("/file", "PATH", "attach a text file (a glob, a folder) to the next message", cmd_file),
        Command("/files", "", "the files attached to the next message, with their tokens", cmd_files),
        Command("/drop", "[PATH]", "remove an attached file (all of them without PATH)", cmd_drop),
        Command("/set", "KEY VALUE", f"change a setting: {', '.join(SETTABLE)}, preset", cmd_set),
        Command("/show", "", "model, template, context use, settings and where each came from", cmd_show),
        Command("/stats", "", "every number about the last reply", cmd_stats),
        Command("/retry", "", "regenerate the last reply", cmd_retry),
        Command("/undo", "", "remove the last message and its reply", cmd_undo),
        Command("/edit", "", "change the last message and resend it; the old exchange stays as a branch", cmd_edit),
        Command("/branch", "[N]", "a new conversation sharing turns 1..N (default: all) with this one", cmd_branch),
        Command("/save", "[NAME]", "name this conversation in the history", cmd_save),
        Command("/load", "NAME|ID", "continue a saved conversation", cmd_load),
        Command("/history", "[N]", "recent saved conversations", cmd_history),
        Command("/tools", "", "the tools the model may call, with their arguments", cmd_tools),
        Command("/tool", "on|off", "offer the tools to the model from the next message, or not", cmd_tool),
    ]
)
ALIASES = {"/quit"}


def dispatch(line: str, ctx: CommandContext) -> Outcome:
    """Run one slash command line. Bad input prints one line and keeps the session."""
    name, arg = split_command(line)
    command = COMMANDS.get(name)
    if command is None:
        ctx.error(f"unknown command {name}; /help lists them")
        return CONTINUE
    return command.handler(ctx, arg)


# --------------------------------------------------------------------------- completion


class SlashCompleter(Completer):
    """Completes only on a line that starts with "/": command names, /set keys, /set preset names,
    and /load's saved conversation names."""

    def __init__(self, session: ChatSession | None = None):
        self.session = session

    def get_completions(self, document: Document, complete_event: CompleteEvent) -> Iterator[Completion]:
        text = document.text_before_cursor
        if not text.startswith("/") or text.startswith("//") or "\n" in text:
            return
        replaced, candidates = self.candidates(text)
        for word, meta in candidates:
            yield Completion(word, start_position=-len(replaced), display_meta=meta)

    def candidates(self, text: str) -> tuple[str, list[tuple[str, str]]]:
        """The part of the line being completed, and (completion, description) pairs for it.
        Pure apart from /load's look-up in the history, for tests."""
        if " " not in text:
            return text, [(c.name, c.help) for c in COMMANDS.values() if c.name.startswith(text.lower())]
        name, rest = text.split(" ", 1)
        name = name.lower()
        words = rest.split(" ")
        if name == "/set":
            if len(words) == 1:
                return words[0], [(key, "setting") for key in (*SETTABLE, "preset") if key.startswith(words[0].lower())]
            if len(words) == 2 and words[0].lower() == "preset":
                return words[1], [(p, _preset_meta(p)) for p in PRESETS if p.startswith(words[1].lower())]
        if name == "/file":
            return _path_candidates(rest)
        if name == "/prompt":
            config = getattr(self.session, "config", None)
            names = sorted(config.prompts) if config is not None else []
            return rest, [(n, "saved prompt") for n in names if n.startswith(rest)]
        if name == "/load":
            # The whole rest of the line is the reference: names may contain spaces.
            return rest, [(ref, meta) for ref, meta in self._saved() if ref.startswith(rest)]
        return text, []

    def _saved(self) -> list[tuple[str, str]]:
        store = getattr(self.session, "history", None)
        if store is None:
            return []
        try:
            summaries = store.list_conversations(limit=50)
        except Exception:  # completion must never break typing
            return []
        found = []
        for summary in summaries:
            if summary.name:
                found.append((summary.name, summary.preview))
            found.append((summary.id, summary.name or summary.preview))
        return found


def _path_candidates(typed: str) -> tuple[str, list[tuple[str, str]]]:
    """Completions of the last path component; folders end with a slash. Hidden names only when
    the component starts with a dot."""
    import os

    folder, start = os.path.split(typed)
    where = os.path.expanduser(folder) or "."
    try:
        names = sorted(os.listdir(where))
    except OSError:
        return start, []
    found = []
    for name in names:
        if not name.startswith(start) or (name.startswith(".") and not start.startswith(".")):
            continue
        is_dir = os.path.isdir(os.path.join(where, name))
        found.append((name + ("/" if is_dir else ""), "folder" if is_dir else "file"))
    return start, found


def _preset_meta(name: str) -> str:
    return ", ".join(f"{k}={v}" for k, v in PRESETS[name].items() if k in ("temperature", "top_k", "top_p"))
