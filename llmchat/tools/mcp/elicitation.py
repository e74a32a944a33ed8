"""A server's `elicitation/create`, answered by the person at the terminal.

Giving the SDK this callback declares the elicitation capability, form mode and URL mode.

- Form mode: the message, then "accept, decline or cancel?" (an empty answer or Ctrl-C cancels);
  on accept each field is asked on stderr (llmchat.tools.mcp.form) and the answers go back.
- URL mode: the message and the URL on stderr, then "open it?": yes opens it in the browser
  (webbrowser) and accepts, anything else declines; Ctrl-C cancels. Only http(s) URLs are asked.
- Without a terminal (stdin or stderr not a TTY: piped, tests), or in a batch, the request is declined at
  once, with one notice: nobody is there to answer, and a call must not hang on it.
- A request llmchat cannot ask (a nested schema, a URL that is not http or https) gets an error
  answer (invalid params) naming why; one the SDK cannot even read, the SDK answers itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import IO, Any
from urllib.parse import urlsplit

from llmchat import interrupts
from llmchat.output import notice
from llmchat.tools.mcp import run_mode
from llmchat.tools.mcp.desk import PersonDesk
from llmchat.tools.mcp.form import FormError, fill_form, form_fields, terminal_ask

URL_QUESTION = "Open it in your browser? [y/N] (Ctrl-C: cancel): "


class Elicitation:
    """The SDK's elicitation_callback for one connection."""

    def __init__(
        self,
        label: str,
        stdin: IO[str],
        stderr: IO[str],
        desk: PersonDesk,
    ):
        self.label = label
        self.stdin = stdin
        self.stderr = stderr
        self.desk = desk

    async def __call__(self, context: Any, params: Any) -> Any:
        if getattr(params, "mode", None) == "url":
            return await self._url(params)
        return await self._form(params)

    async def _form(self, params: Any) -> Any:
        try:
            fields = form_fields(params.requested_schema)
        except FormError as err:
            return self._refused(f"its form cannot be asked: {err}")
        if not self._can_ask():
            return self._declined_without_terminal(params.message)
        ask = terminal_ask(self.stdin, self.stderr)
        action, content = await self.desk.ask(lambda: fill_form(self._heading(params.message), fields, ask, self._say))
        return _result(action, content if action == "accept" else None)

    async def _url(self, params: Any) -> Any:
        if urlsplit(params.url).scheme not in ("http", "https"):
            return self._refused(f"it asks to open {params.url!r}, which is not an http or https URL")
        if not self._can_ask():
            return self._declined_without_terminal(f"{params.message} {params.url}")
        ask = terminal_ask(self.stdin, self.stderr)
        action = await self.desk.ask(lambda: self._open_url(params.message, params.url, ask))
        return _result(action)

    def _open_url(self, message: str, url: str, ask: Callable[[str], str | None]) -> str:
        self._say(self._heading(message))
        self._say(f"  {url}")
        try:
            typed = ask(URL_QUESTION)
        except KeyboardInterrupt:
            interrupts.consume()  # this Ctrl-C cancelled the question; the call and the turn go on
            typed = None
        if typed is None:
            self._say("cancelled")
            return "cancel"
        if typed.strip().lower() not in ("y", "yes"):
            return "decline"
        import webbrowser

        if not webbrowser.open(url):
            self._say("  no browser could be started: open the URL yourself")
        return "accept"

    def _can_ask(self) -> bool:
        """Whether a person can be asked: stdin and stderr are a terminal, and this is not a batch."""
        return run_mode.person_at(self.stdin, self.stderr)

    def _heading(self, message: str) -> str:
        return f"llmchat: {self.label} asks: {message}"

    def _say(self, line: str) -> None:
        self.stderr.write(line + "\n")
        self.stderr.flush()

    def _declined_without_terminal(self, what: str) -> Any:
        notice(
            f"llmchat: {self.label} asks for input ({_one_line(what)}): declined, no terminal to ask on", self.stderr
        )
        return _result("decline")

    def _refused(self, why: str) -> Any:
        from mcp_types import INVALID_PARAMS, ErrorData

        # No notice here: the server gets the reason, and a call it fails says it in its one line.
        return ErrorData(code=INVALID_PARAMS, message=f"llmchat cannot ask this: {why}")


def _result(action: str, content: dict[str, Any] | None = None) -> Any:
    from mcp_types import ElicitResult

    return ElicitResult(action=action, content=content)  # type: ignore[arg-type]


def _one_line(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
