"""A server's `elicitation/create`, answered by the person at the terminal (llmchat.edges.person).

Giving the SDK this callback declares the elicitation capability, form mode and URL mode.

- Form mode: the message, then "accept, decline or cancel?" (an empty answer or Ctrl-C cancels);
  on accept each field is asked (llmchat.tools.mcp.form) and the answers go back.
- URL mode: the message and the URL, then "open it?": yes opens it in the browser (webbrowser) and
  accepts, anything else declines; Ctrl-C cancels. Only http(s) URLs are asked.
- The message, the URL and the fields are the server's text: shown terminal-safe, so an escape
  sequence in them is seen, never run (a link that shows one address and opens another).
- A server's `elicitation = "defaults"` (for unattended runs: batch, scripts, CI) answers a form
  without asking anyone: accepted, with each field's schema default (SEP-1034); a form with a
  required field that has no default is declined. `elicitation = "decline"` declines every
  request. Both decline URL requests: opening a browser for nobody is never right.
- Where nobody is there to answer (no terminal, a batch), the request is declined at once, with
  one notice; so is one that comes while llmchat waits on no request of the server's (after its
  call was answered, between turns): nobody would ask it, and the server must not wait forever.
- A request llmchat cannot ask (a nested schema, a URL that is not http or https) gets an error
  answer (invalid params) naming why; one the SDK cannot even read, the SDK answers itself.
"""

from __future__ import annotations

from typing import IO, Any
from urllib.parse import urlsplit

from llmchat.edges import person as people
from llmchat.edges.safe_text import for_stream
from llmchat.output import is_tty, notice
from llmchat.tools.mcp.desk import NobodyWaits, PersonDesk
from llmchat.tools.mcp.form import Field, FormError, fill_form, form_fields

URL_QUESTION = "Open it in your browser? [y/N] (Ctrl-C: cancel): "
OUTSIDE = "it came outside any request of llmchat's"


class Elicitation:
    """The SDK's elicitation_callback for one connection; its notices go to `stderr`."""

    def __init__(self, label: str, stderr: IO[str], desk: PersonDesk, answer: str = "ask"):
        self.label = label
        self.stderr = stderr
        self.desk = desk
        self.answer = answer  # the server's `elicitation`: "ask", "defaults" or "decline"

    async def __call__(self, context: Any, params: Any) -> Any:
        if getattr(params, "mode", None) == "url":
            return await self._url(params)
        return await self._form(params)

    async def _form(self, params: Any) -> Any:
        try:
            fields = form_fields(params.requested_schema)
        except FormError as err:
            return self._refused(f"its form cannot be asked: {err}")
        if self.answer == "decline":
            return self._declined(params.message, 'elicitation = "decline" for this server')
        if self.answer == "defaults":
            return self._with_defaults(params.message, fields)
        person = people.current()
        if not person.present():
            return self._declined(params.message, "no terminal to ask on")
        heading = self._heading(params.message)
        try:
            action, content = await self.desk.ask(lambda: fill_form(heading, fields, person.ask, person.say))
        except NobodyWaits:
            return self._declined(params.message, OUTSIDE)
        return _result(action, content if action == "accept" else None)

    async def _url(self, params: Any) -> Any:
        if urlsplit(params.url).scheme not in ("http", "https"):
            return self._refused(f"it asks to open {params.url!r}, which is not an http or https URL")
        if self.answer != "ask":
            return self._declined(f"{params.message} {params.url}", f'elicitation = "{self.answer}" for this server')
        person = people.current()
        if not person.present():
            return self._declined(f"{params.message} {params.url}", "no terminal to ask on")
        try:
            action = await self.desk.ask(lambda: self._open_url(params.message, params.url, person))
        except NobodyWaits:
            return self._declined(f"{params.message} {params.url}", OUTSIDE)
        return _result(action)

    def _open_url(self, message: str, url: str, person: people.Person) -> str:
        typed = person.ask(URL_QUESTION, about=[self._heading(message), f"  {url}"])
        if typed is None:
            person.say("cancelled")
            return "cancel"
        if typed.strip().lower() not in ("y", "yes"):
            return "decline"
        import webbrowser

        if not webbrowser.open(url):
            person.say("  no browser could be started: open the URL yourself")
        return "accept"

    def _with_defaults(self, message: str, fields: list[Field]) -> Any:
        """Accepted without asking anyone, each field given its schema default (SEP-1034); a
        required field without one cannot be answered so."""
        missing = [field.key for field in fields if field.required and "default" not in field.schema]
        if missing:
            return self._declined(message, f'no default for {", ".join(missing)} (elicitation = "defaults")')
        return _result("accept", {field.key: field.schema["default"] for field in fields if "default" in field.schema})

    def _heading(self, message: str) -> str:
        return f"llmchat: {self.label} asks: {message}"

    def _declined(self, what: str, why: str) -> Any:
        line = f"llmchat: {self.label} asks for input ({_one_line(what)}): declined, {why}"
        notice(for_stream(line, is_tty(self.stderr)), self.stderr)
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
