"""The interactive chat: a prompt-toolkit prompt, slash commands, and one streamed reply per turn.

Replies go through `ChatSession.turn` with `output.StreamPrinter`, the same path `ask` uses, so
the live readout (bottom row while decoding) and the summary line are the same everywhere.

Keys: Enter sends; Alt-Enter (or Esc then Enter) inserts a newline; a bracketed paste stays one
message however many lines it has; Ctrl-X Ctrl-E opens the message in $VISUAL / $EDITOR, and vi
keys come with `editing_mode = "vi"` (llmchat.ui.editing). Ctrl-C stops a reply; at the prompt it clears the line, and on
an empty line the first press prints a hint and a second consecutive press exits. Ctrl-D exits.
On a terminal the reply is rendered as Markdown while it streams, unless `--render plain`
(llmchat.ui.markdown); the caller decides (never when stdout is not a terminal).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Callable, TextIO

from llmchat import interrupts
from llmchat.edges.safe_text import terminal_safe
from llmchat.errors import ContextOverflowError, HistoryError, LlmchatError
from llmchat.output import StreamPrinter, is_tty, notice
from llmchat.turn.attachments import compose
from llmchat.ui.completer import SlashCompleter
from llmchat.ui.context import Action, CommandContext
from llmchat.ui.markdown import MarkdownPrinter
from llmchat.ui.slash import dispatch, is_command, split_command, unescape_message
from llmchat.ui.terminal import CtrlCGuard, input_history, quiet_terminal

if TYPE_CHECKING:
    from prompt_toolkit import PromptSession
    from prompt_toolkit.key_binding import KeyPressEvent

    from llmchat.store.attachment_records import Attachment
    from llmchat.tools.mcp.sources import McpSources
    from llmchat.turn.record import TurnResult
    from llmchat.turn.session import ChatSession

EXIT_HINT = "press Ctrl-C again or Ctrl-D to exit"
PROMPT = "> "
CONTINUATION = "… "


class ChatUI:
    """One chat on a terminal: the prompt, the slash commands (their context lives here, with the
    files pending for the next message) and one streamed turn per message."""

    def __init__(
        self,
        session: ChatSession,
        *,
        show_stats: bool,
        markdown: bool,
        verbose: bool,
        persist_input: bool | None = None,
        attachments: tuple[Attachment, ...] = (),
        opening: str = "",
        mcp: McpSources | None = None,
        editing_mode: str = "emacs",
        stdout: TextIO | None = None,
        stderr: TextIO | None = None,
    ):
        from llmchat.ui.safe_console import safe_console

        self.session = session
        self.show_stats = show_stats
        self.markdown = markdown
        self.verbose = verbose
        self.persist_input = session.history is not None if persist_input is None else persist_input
        # The command's environment's streams; without them, the streams of this moment (not of
        # import time: tests and callers may have replaced sys.stdout / sys.stderr).
        self.stdout = stdout if stdout is not None else sys.stdout
        self.stderr = stderr if stderr is not None else sys.stderr
        # What the slash commands show names what came from outside (a model, a tool, a server,
        # a stored conversation): made terminal-safe on a terminal, exact into a pipe.
        self.console = safe_console(self.stdout, on_terminal=is_tty(self.stdout))
        self.guard = CtrlCGuard()
        self.completer = SlashCompleter(session, mcp)
        self.context = CommandContext(session=session, out=self.console, error=self.error, info=self.info, mcp=mcp)
        self.context.attachments.extend(attachments)  # chat -f: pending for the first message
        self.opening = opening  # chat -p mcp:SERVER/NAME: the prompt's text, at the prompt to edit and send
        self.vi_mode = editing_mode == "vi"  # the config's editing_mode (checked when it was read)
        self._tie_typed_lines: Callable[[], None] = lambda: None  # the input history's, once the prompt is built

    # --- output -----------------------------------------------------------------------------
    def error(self, message: str) -> None:
        """One line on stderr, red on a terminal. It may quote a server, a tool or a file: made
        terminal-safe there (llmchat.edges.safe_text), as `notice` does for the dim lines."""
        if is_tty(self.stderr):
            self.stderr.write(f"\x1b[31m{terminal_safe(message)}\x1b[0m\n")
        else:
            self.stderr.write(message + "\n")
        self.stderr.flush()

    def info(self, message: str) -> None:
        notice(message, self.stderr)

    def welcome(self) -> None:
        session = self.session
        template = session.template
        source = template.source_detail if self.verbose else template.source
        shown = template.name if source in ("", template.name) else f"{template.name} ({source})"
        notice(
            f"{session.model_label} · template {shown} · ctx {session.engine.n_ctx:,} · /help for commands",
            self.stderr,
        )

    # --- prompt ---------------------------------------------------------------------------------
    def build_prompt(self) -> PromptSession[str]:
        from prompt_toolkit import PromptSession
        from prompt_toolkit.application import run_in_terminal
        from prompt_toolkit.filters import emacs_mode, vi_insert_mode
        from prompt_toolkit.key_binding import KeyBindings, merge_key_bindings
        from prompt_toolkit.styles import Style

        from llmchat.ui.editing import editing_bindings, mode_line

        bindings = KeyBindings()

        # Not in vi's normal mode, where Esc has been pressed already and Enter sends.
        @bindings.add("escape", "enter", filter=emacs_mode | vi_insert_mode)
        def _newline(event: KeyPressEvent) -> None:
            event.current_buffer.insert_text("\n")

        @bindings.add("c-c")
        def _ctrl_c(event: KeyPressEvent) -> None:
            buffer = event.current_buffer
            action = self.guard.press(buffer.text)
            if action == CtrlCGuard.CLEAR:
                buffer.reset()
            elif action == CtrlCGuard.HINT:
                run_in_terminal(lambda: self.info(EXIT_HINT))
            else:
                event.app.exit(exception=EOFError())

        output = None
        if not is_tty(self.stdout) and is_tty(self.stderr):
            # `llmchat chat | tee log`: replies go to the pipe, the prompt stays on the terminal.
            from prompt_toolkit.output import create_output

            output = create_output(stdout=self.stderr)
        history, self._tie_typed_lines = input_history(
            self.error, self.persist_input, owner=lambda: self.session.conversation_id
        )
        prompt: PromptSession[str] = PromptSession(
            output=output,
            history=history,
            completer=self.completer,
            complete_while_typing=True,
            complete_in_thread=True,  # a slow look-up (the history, a server's listing) never stops typing
            key_bindings=merge_key_bindings([bindings, editing_bindings(self.error)]),
            multiline=False,  # Enter sends; newlines come from Alt-Enter or a paste
            prompt_continuation=lambda width, line_number, wrap_count: CONTINUATION.rjust(width),
            vi_mode=self.vi_mode,
            rprompt=mode_line if self.vi_mode else None,
            style=Style.from_dict({"prompt": "bold ansicyan", "mode": "bold"}),
            enable_open_in_editor=False,  # its binding sends the message as the editor closes: llmchat.ui.editing's
        )
        # Typing disarms the exit guard: only two Ctrl-C presses in a row exit.
        prompt.default_buffer.on_text_changed += lambda _buffer: self._text_changed()
        return prompt

    def _text_changed(self) -> None:
        if self.guard.armed and self._prompt is not None and self._prompt.default_buffer.text:
            self.guard.reset()

    # --- turns ----------------------------------------------------------------------------------
    def run_turn(self, text: str, attachments: tuple[Attachment, ...] | None = None) -> str:
        """Run one turn; returns text to put back at the prompt ("" when the message was sent).
        `attachments`: the files `text` goes with (/retry); None: those attached with /file."""
        session = self.session
        printer_class = MarkdownPrinter if self.markdown else StreamPrinter
        printer = printer_class(self.stdout, self.stderr, show_live=self.show_stats, show_summary=self.show_stats)
        committed: list[TurnResult] = []  # the turn, once it joined the conversation
        from_pending = attachments is None  # /file: sent with this message, then cleared
        attachments = tuple(self.context.attachments) if attachments is None else attachments
        try:
            with interrupts.FirstCtrlCOnly(), quiet_terminal(sys.stdin):
                # Only a message that carries files passes them (a session without files is called as before).
                message = compose(attachments, text)
                if attachments:
                    result = session.turn(message, printer, on_commit=committed.append, attachments=attachments)
                else:
                    result = session.turn(message, printer, on_commit=committed.append)
        except ContextOverflowError as err:
            # Raised before anything is generated: nothing changed; give the text back to edit.
            printer.abort()
            self.error(f"error: {err}")
            return self._put_back(text, attachments, from_pending)
        except LlmchatError as err:
            # Any other error the user can act on (a template that refuses this conversation, the
            # engine failing mid-reply, ...): one line, and the chat goes on. Before the turn joined
            # the conversation the message goes back to the prompt; after, the reply so far is kept.
            printer.abort()
            self.error(f"error: {err}")
            if not committed:
                return self._put_back(text, attachments, from_pending)
            result = committed[0]
        except KeyboardInterrupt:
            # Ctrl-C outside the decode loop: before generation (nothing sent: give the text back)
            # or while the finished reply was being shown.
            interrupts.consume()
            printer.abort()
            if not committed:
                self.info("[interrupted]")
                return self._put_back(text, attachments, from_pending)
            result = committed[0]
        except BaseException:
            printer.abort()
            raise
        if from_pending:
            self.context.attachments.clear()
        for line in result.notices:  # a trim, a failed save: the same notices as ask and batch
            (self.error if line.startswith("warning:") else self.info)(line)
        if result.error:  # structured output that is not what --schema asked (cut off, invalid)
            self.error(f"error: {result.error}")
        return ""

    def _put_back(self, text: str, attachments: tuple[Attachment, ...], from_pending: bool) -> str:
        """A message that was not sent goes back to the prompt, and the files it carried (/retry's)
        back to the ones pending for the next message."""
        if not from_pending:
            self.context.attachments[:] = [*attachments, *(a for a in self.context.attachments if a not in attachments)]
        return text

    # --- main loop --------------------------------------------------------------------------------
    _prompt: PromptSession[str] | None = None

    def run(self) -> None:
        self.welcome()
        if self.context.attachments:  # chat -f: say what the files take before the first message
            from llmchat.turn.attachments import count_line, tokens_of

            for attachment in self.context.attachments:
                tokens, _ = tokens_of(self.session, attachment)
                self.info(count_line(attachment, tokens, self.session.engine.n_ctx))
        self._prompt = self.build_prompt()
        pending = self.opening  # text put back into the prompt (a message that did not fit)
        try:
            self._prompt_loop(pending)
        finally:
            self._tie_typed_lines()  # the chat's first lines, to the conversation they began

    def _prompt_loop(self, pending: str) -> None:
        assert self._prompt is not None
        while True:
            self._tie_typed_lines()  # once the first reply made the conversation (llmchat.store.typed_lines)
            self.guard.reset()
            self.completer.new_prompt()
            # A Ctrl-C deferred past the end of what it meant to stop (a reply's last frame) has
            # nothing left to stop: it must not cut the next reply short at its first token.
            interrupts.consume()
            try:
                line = self._prompt.prompt([("class:prompt", PROMPT)], default=pending)
            except EOFError:
                break
            except KeyboardInterrupt:  # not expected (Ctrl-C is bound), but never fatal
                interrupts.consume()
                pending = ""
                continue
            pending = ""
            if not line.strip():
                continue
            if is_command(line) and self._attach_pasted(line) == "":
                continue  # an absolute path dropped on the prompt, not a command: attached to the next message
            if is_command(line):
                try:
                    with interrupts.Command():
                        outcome = dispatch(line, self.context)
                except HistoryError as err:  # a read that failed mid-command (locked, unreadable)
                    self.error(f"error: {err}")
                    continue
                except KeyboardInterrupt:  # Ctrl-C before the command changed anything: it is cancelled
                    interrupts.consume()
                    self.info(f"[{split_command(line)[0]} interrupted; nothing changed]")
                    continue
                held = interrupts.interrupt_pending()  # a Ctrl-C that came once the change had begun
                if held:
                    interrupts.consume()
                    self.info(f"[{split_command(line)[0]} was already changing the chat when Ctrl-C came; it finished]")
                if outcome.action is Action.EXIT:
                    break
                if outcome.action is Action.CONTINUE:
                    continue
                if outcome.action is Action.EDIT:
                    pending = outcome.text or ""
                    continue
                if held:  # a held Ctrl-C sends nothing: the message waits at the prompt, with its files
                    attached = outcome.attachments
                    pending = self._put_back(outcome.text or "", attached or (), from_pending=attached is None)
                    continue
                pending = self.run_turn(outcome.text or "", outcome.attachments)
                continue
            text = unescape_message(line)
            kept = self._attach_pasted(text)
            if kept is not None:  # a path alone (attached to the next message), or one that failed
                pending = kept
                continue
            pending = self.run_turn(text)

    def _attach_pasted(self, text: str) -> str | None:
        """A message that is only the path of an image or audio file (a file dropped on the
        terminal: llmchat.media.pasted_paths) attaches it to the next message, as /image does, and
        leaves nothing at the prompt (""). Paths of such files inside a longer message are not
        attached, only named with how to attach them; the message is sent as typed (None)."""
        from llmchat.media.pasted_paths import pasted_media
        from llmchat.ui.file_commands import cmd_file

        paths, whole = pasted_media(text)
        if whole:
            cmd_file(self.context, paths[0])
            return ""
        if paths and not is_command(text):  # a command that names a file (/file photo.png) is the command's
            how = f"/image {paths[0]} attaches it" if len(paths) == 1 else "/image PATH attaches each"
            self.info(terminal_safe(f"not attached: {', '.join(paths)} ({how} to your next message)"))
        return None


def run_interactive(
    session: ChatSession,
    *,
    show_stats: bool,
    markdown: bool,
    verbose: bool,
    persist_input: bool | None = None,
    attachments: tuple[Attachment, ...] = (),
    opening: str = "",
    mcp: McpSources | None = None,
    editing_mode: str = "emacs",
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> None:
    """The interactive chat on a terminal. Returns when the user exits (/exit, Ctrl-D, Ctrl-C twice).

    `persist_input`: keep typed lines in `paths.input_history_file()`; by default only when the
    conversation history is on, so `--no-history` leaves nothing typed on disk.
    """
    ChatUI(
        session,
        show_stats=show_stats,
        markdown=markdown,
        verbose=verbose,
        persist_input=persist_input,
        attachments=attachments,
        opening=opening,
        mcp=mcp,
        editing_mode=editing_mode,
        stdout=stdout,
        stderr=stderr,
    ).run()
