"""Every question llmchat asks goes through one object (llmchat.edges.person). On real terminals (a
pseudo-terminal of this process, or pexpect's around the CLI), with the real engine (SmolLM2) and
real MCP servers written here (the SDK's MCPServer; a hand-written one for the handshake-era
protocol, whose servers may send a request whenever they like):
- a Ctrl-C a question took is its "no", and the next Ctrl-C still stops the chat's turn;
- what was typed before a question (while the model loaded, while a reply streamed) never answers it;
- the answer is echoed as it is typed, also in the chat, which turns echo off while a reply streams;
- a question a server asks outside any request of llmchat's is declined at once, never held;
- the server's text in a question (an elicitation's message, URL and fields, a sampling request)
  is shown with its escapes visible, never run;
- a server given with --mcp whose name a config table has is that server, or one line saying so.
Every wait is bounded: pexpect's timeouts, the calls' timeouts, bounded loops over a pty.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import sys
import termios
import threading
from pathlib import Path

import pexpect
import pytest

from llmchat import interrupts
from llmchat.edges.person import Person
from llmchat.edges.safe_text import terminal_safe
from llmchat.tools.mcp.elicitation import URL_QUESTION
from llmchat.tools.mcp.sampling import QUESTION as SAMPLING_QUESTION
from tests.test_chat_ui import ENTER, _spawn_chat
from tests.test_tools_loop import FORCED, QUESTION, calls_made, functions_file

SUMMARY = r"prompt \d+ \(\d+ cached\)"
# What a hostile server puts in its text: a link that shows one thing and opens another (OSC 8),
# a screen wipe (CSI 2J) and a right-to-left override that reorders what follows.
HOSTILE = "\x1b]8;;https://evil.example/\x07click\x1b]8;;\x07 \x1b[2J\u202eabc"
RAW = ("\x1b]", "\x1b[2J", "\u202e")  # none of them may reach the terminal as they are

ASKING_SERVER = f'''
import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import (
    CreateMessageRequest,
    CreateMessageRequestParams,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitRequestURLParams,
    InputRequiredResult,
    SamplingMessage,
    TextContent,
)

HOSTILE = {HOSTILE!r}
server = MCPServer("asking")


def asking(request):
    """The 2026-07-28 way for a server to ask: the call's result asks, and the call comes again."""
    return InputRequiredResult(input_requests={{"it": request}})


@server.tool()
async def consult(ctx: Context) -> InputRequiredResult | str:
    """Ask the person to read a page, then think it over for a long time."""
    if not ctx.input_responses:
        url = ElicitRequestURLParams(message="Read the terms.", url="https://example.com/terms", elicitation_id="t")
        return asking(ElicitRequest(params=url))
    await ctx.report_progress(1, 2, "thinking it over")
    await anyio.sleep(120)  # far longer than the test waits: only a Ctrl-C ends it in time
    return "done thinking"


@server.tool()
async def hostile_form(ctx: Context) -> InputRequiredResult | str:
    """A form whose message and field hold escape sequences."""
    if ctx.input_responses:
        return "answered"
    field = {{"type": "string", "title": "Name" + HOSTILE, "description": "Yours" + HOSTILE}}
    schema = {{"type": "object", "properties": {{"name": field}}, "required": ["name"]}}
    return asking(ElicitRequest(params=ElicitRequestFormParams(message="Fill it in" + HOSTILE, requested_schema=schema)))


@server.tool()
async def hostile_url(ctx: Context) -> InputRequiredResult | str:
    """A URL request whose message and URL hold escape sequences."""
    if ctx.input_responses:
        return "answered"
    url = ElicitRequestURLParams(message="Log in" + HOSTILE, url="https://example.com/" + HOSTILE, elicitation_id="u")
    return asking(ElicitRequest(params=url))


@server.tool()
async def hostile_sample(ctx: Context) -> InputRequiredResult | str:
    """A sampling request whose system prompt and message hold escape sequences."""
    if ctx.input_responses:
        return "sampled"
    message = SamplingMessage(role="user", content=TextContent(type="text", text="Say hi" + HOSTILE))
    params = CreateMessageRequestParams(messages=[message], max_tokens=8, system_prompt="Be brief" + HOSTILE)
    return asking(CreateMessageRequest(params=params))


server.run()
'''

# Handshake-era (2025-11-25) servers may send a request of their own at any time; this one asks
# (elicitation/create) once the test makes the trigger file, after its only call was answered.
LATER_SERVER = r"""
import json
import os
import sys
import threading
import time

trigger, record = sys.argv[1], sys.argv[2]
lock = threading.Lock()


def send(message):
    with lock:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def ask_when_triggered():
    for _ in range(6000):  # bounded: the test makes the file once its turn is over
        if os.path.exists(trigger):
            break
        time.sleep(0.05)
    form = {"type": "object", "properties": {"answer": {"type": "string"}}}
    send({"jsonrpc": "2.0", "id": "later", "method": "elicitation/create",
          "params": {"message": "One more thing?", "requestedSchema": form}})


for line in sys.stdin:
    message = json.loads(line)
    method, request_id = message.get("method"), message.get("id")
    if request_id == "later" and method is None:  # the client's answer to the question
        with open(record, "w", encoding="utf-8") as out:
            json.dump(message.get("result") or message.get("error"), out)
    elif request_id is None:
        continue  # a notification
    elif method == "initialize":
        send({"jsonrpc": "2.0", "id": request_id, "result": {"protocolVersion": "2025-11-25",
              "capabilities": {"tools": {}}, "serverInfo": {"name": "later", "version": "1"}}})
    elif method == "tools/list":
        tool = {"name": "later", "description": "Ask the user later.", "inputSchema": {"type": "object"}}
        send({"jsonrpc": "2.0", "id": request_id, "result": {"tools": [tool]}})
    elif method == "tools/call":
        send({"jsonrpc": "2.0", "id": request_id, "result": {"content": [{"type": "text", "text": "I will ask later."}]}})
        threading.Thread(target=ask_when_triggered, daemon=True).start()
    else:
        send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": f"no method {method}"}})
"""


def written(folder: Path, name: str, text: str) -> str:
    """The server script `name` in `folder`, as the --mcp command that starts it."""
    script = folder / name
    script.write_text(text, encoding="utf-8")
    return f"{sys.executable} {script}"


def recorded(child: pexpect.spawn) -> io.StringIO:
    """Everything the child writes to the terminal from now on, as it wrote it."""
    log = io.StringIO()
    child.logfile_read = log
    return log


def shown(raw: str) -> str:
    """The terminal's text without llmchat's own styling (CSI sequences) and carriage returns."""
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\r", "", raw)


def spawned(home: Path, *args: str, timeout: int = 180) -> pexpect.spawn:
    """`python -m llmchat ARGS` on a pseudo-terminal, wide enough that no line wraps."""
    env = dict(os.environ, LLMCHAT_HOME=str(home), TERM="xterm-256color", PROMPT_TOOLKIT_NO_CPR="1")
    env.pop("LLMCHAT_MODEL", None)
    return pexpect.spawn(
        sys.executable,
        ["-m", "llmchat", *args],
        env=env,
        encoding="utf-8",
        codec_errors="replace",
        dimensions=(40, 400),
        timeout=timeout,
    )


def finished(child: pexpect.spawn) -> int:
    child.expect(pexpect.EOF)
    child.close()
    return child.exitstatus


# --- the object, on a pseudo-terminal of this process -----------------------------------------


class Terminal:
    """A pseudo-terminal: the person's side (stdin and stderr of a Person) and a keyboard that
    types on it and reads what is shown, on a thread of its own."""

    def __init__(self) -> None:
        self.keyboard, side = os.openpty()
        self.stdin = open(side, encoding="utf-8", closefd=False)  # noqa: SIM115 - closed in close()
        self.stderr = open(side, "w", encoding="utf-8", closefd=True)  # noqa: SIM115
        self.screen = ""
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.keyboard, 4096)
            except OSError:  # the person's side closed
                return
            if not data:
                return
            with self._changed:
                self.screen += data.decode("utf-8", "replace")
                self._changed.notify_all()

    def shows(self, text: str) -> None:
        """Wait until `text` is on the screen (bounded: an assertion after 60 s)."""
        with self._changed:
            assert self._changed.wait_for(lambda: text in self.screen, timeout=60), self.screen

    def type(self, keys: str) -> None:
        os.write(self.keyboard, keys.encode())

    def echo(self, on: bool) -> None:
        attributes = termios.tcgetattr(self.stdin.fileno())
        attributes[3] = attributes[3] | termios.ECHO if on else attributes[3] & ~termios.ECHO
        termios.tcsetattr(self.stdin.fileno(), termios.TCSANOW, attributes)

    def echoes(self) -> bool:
        return bool(termios.tcgetattr(self.stdin.fileno())[3] & termios.ECHO)

    def close(self) -> None:
        self.stdin.close()
        self.stderr.close()
        os.close(self.keyboard)


@pytest.fixture
def terminal():
    opened = Terminal()
    yield opened
    opened.close()


def answering(terminal: Terminal, question: str, keys: str) -> threading.Thread:
    """Type `keys` once `question` is on the screen (on a thread: the question blocks this one)."""
    thread = threading.Thread(target=lambda: (terminal.shows(question), terminal.type(keys)), daemon=True)
    thread.start()
    return thread


def test_a_question_takes_only_what_is_typed_after_it_and_shows_it(terminal):
    person = Person(terminal.stdin, terminal.stderr)
    assert person.present()
    terminal.type("y\n")  # typed ahead, while (say) a reply streamed
    terminal.shows("y\r\n")  # echoed by the terminal: it is in the terminal's input queue now
    terminal.echo(False)  # as the chat has it while a reply streams (llmchat.ui.terminal.quiet_terminal)
    typing = answering(terminal, "run it? ", "no\n")
    assert person.ask("run it? ", about=["tool call: " + HOSTILE]) == "no"
    typing.join()
    terminal.shows("run it? no\r\n")  # the answer was echoed as it was typed
    assert not terminal.echoes(), "the terminal's settings are put back after the question"
    assert terminal_safe(HOSTILE) in terminal.screen and not any(raw in terminal.screen for raw in RAW)


def test_a_ctrl_c_a_question_took_leaves_the_next_one_to_stop_the_turn(terminal):
    """As the terminal sends it, to the process: Linux gives it to the main thread, which waits in
    the question's read."""
    person = Person(terminal.stdin, terminal.stderr)

    def ctrl_c() -> None:
        os.kill(os.getpid(), signal.SIGINT)

    with interrupts.FirstCtrlCOnly():
        pressing = threading.Thread(target=lambda: (terminal.shows("run it? "), ctrl_c()), daemon=True)
        pressing.start()
        assert person.ask("run it? ") is None, "Ctrl-C at a question is no answer"
        pressing.join()
        with pytest.raises(KeyboardInterrupt):  # the next Ctrl-C is the turn's first: it stops it
            ctrl_c()
        ctrl_c()  # and later ones are ignored until the turn is over
    interrupts.consume()


def test_nobody_is_there_without_a_terminal_or_in_a_batch(terminal):
    assert not Person(io.StringIO(), io.StringIO()).present()
    assert not Person(terminal.stdin, terminal.stderr, attended=False).present()
    assert Person(terminal.stdin, io.StringIO()).ask("run it? ") is None  # asked of nobody: no answer


# --- Ctrl-C, typed-ahead input and echo, through the CLI ----------------------------------------


def test_a_ctrl_c_a_question_took_does_not_stop_the_next_one_from_ending_the_turn(
    isolated_home, smollm2_path, tmp_path
):
    """In the chat only the first Ctrl-C of a turn counts (the rest are ignored while the turn
    ends). A Ctrl-C that answered a question (here a server's "open this page?") was the
    question's: the next one, while the server's call goes on, stops the turn."""
    server = written(tmp_path, "asking_server.py", ASKING_SERVER)
    pexpect_module, child = _spawn_chat(
        isolated_home,
        *("-m", str(smollm2_path), "--mcp", server, "--tool-choice", "python_consult", "--approve-tools"),
        *("--chain-limit", "1", "--max-tokens", "48"),
    )
    try:
        child.expect_exact("> ")
        child.send("Consult the server." + ENTER)
        child.expect_exact(URL_QUESTION)
        child.sendintr()  # taken by the question: cancel
        child.expect_exact("cancelled")
        child.expect_exact("thinking it over")  # the call goes on (the server's progress)
        child.sendintr()
        index = child.expect([r"\[interrupted\]", SUMMARY], timeout=90)
        assert index == 0, "the second Ctrl-C did not stop the turn"
        child.expect_exact("> ")
        child.send("/exit" + ENTER)
        assert finished(child) == 0
    finally:
        child.close()


def test_what_was_typed_before_the_question_does_not_answer_it(isolated_home, smollm2_path, tmp_path):
    """A "y" typed early (here while the model loads; in the chat, while a reply streams) is not
    an answer to the question asked later: the question waits for what is typed after it."""
    tools = functions_file(tmp_path)
    args = ("ask", "-m", str(smollm2_path), *FORCED, "--functions", str(tools), "--tool-choice", "record_city")
    child = spawned(isolated_home, *args, "What is the weather in Paris?")
    try:
        child.send("y\r")  # before anything is asked
        child.expect(QUESTION)
        assert calls_made(tmp_path) == [], "the early y approved the call"
        child.send("n\r")
        assert finished(child) == 0
    finally:
        child.close()
    assert calls_made(tmp_path) == []


def test_in_the_chat_the_answer_is_echoed_as_it_is_typed(isolated_home, smollm2_path, tmp_path):
    """The chat turns echo off while a reply streams; a question in the turn turns it on again."""
    tools = functions_file(tmp_path)
    pexpect_module, child = _spawn_chat(
        isolated_home,
        *("-m", str(smollm2_path), "--seed", "1", "--max-tokens", "48", "--chain-limit", "1"),
        *("--functions", str(tools), "--tool-choice", "record_city"),
    )
    try:
        child.expect_exact("> ")
        child.send("What is the weather in Paris?" + ENTER)
        child.expect(QUESTION)
        child.send("NO\r")
        child.expect_exact("\n")
        assert shown(child.before) == "NO", "the answer was typed blind"
        child.expect(SUMMARY)
        child.expect_exact("> ")
        child.send("/exit" + ENTER)
        assert finished(child) == 0
    finally:
        child.close()
    assert calls_made(tmp_path) == []


# --- a question outside any request --------------------------------------------------------------


def test_a_question_that_comes_outside_any_request_is_declined_at_once(isolated_home, smollm2_path, tmp_path):
    """A server asks after its call was answered, while the chat waits at its prompt: nobody will
    ask it (the terminal is the prompt's), so it is declined at once with one notice, and the
    server has its answer instead of waiting for ever."""
    trigger, record = tmp_path / "ask-now", tmp_path / "answer.json"
    server = f"{written(tmp_path, 'later_server.py', LATER_SERVER)} {trigger} {record}"
    pexpect_module, child = _spawn_chat(
        isolated_home,
        *("-m", str(smollm2_path), "--mcp", server, "--tool-choice", "python_later", "--approve-tools"),
        *("--chain-limit", "1", "--max-tokens", "48"),  # room for the whole forced call
    )
    try:
        child.expect_exact("> ")
        child.send("Go." + ENTER)
        child.expect(SUMMARY)  # the turn is over: no request of llmchat's runs
        child.expect_exact("> ")
        trigger.write_text("now", encoding="utf-8")
        child.expect_exact(
            "llmchat: MCP server python asks for input (One more thing?): declined, it came outside any "
            "request of llmchat's",
            timeout=60,
        )
        child.send("/exit" + ENTER)
        assert finished(child) == 0
    finally:
        child.close()
    assert json.loads(record.read_text(encoding="utf-8")) == {"action": "decline"}


# --- a server's text in a question ---------------------------------------------------------------


def test_escapes_in_a_forms_message_and_fields_are_shown_not_run(isolated_home, tmp_path):
    server = written(tmp_path, "asking_server.py", ASKING_SERVER)
    child = spawned(isolated_home, "mcp", "call", "python", "hostile_form", "--mcp", server, timeout=60)
    log = recorded(child)
    try:
        child.expect_exact("[a]ccept, [d]ecline, [c]ancel (empty: cancel): ")
        child.send("a\r")
        child.expect(r"\n  name \([^\n]*\): ")
        child.send("Ada\r")
        assert finished(child) == 0
    finally:
        child.close()
    screen = log.getvalue()
    assert "Fill it in" + terminal_safe(HOSTILE) in screen
    assert "Name" + terminal_safe(HOSTILE) in screen and "Yours" + terminal_safe(HOSTILE) in screen
    assert not any(raw in screen for raw in RAW), screen


def test_escapes_in_a_url_request_are_shown_not_run(isolated_home, tmp_path):
    server = written(tmp_path, "asking_server.py", ASKING_SERVER)
    child = spawned(isolated_home, "mcp", "call", "python", "hostile_url", "--mcp", server, timeout=60)
    log = recorded(child)
    try:
        child.expect_exact(URL_QUESTION)
        child.send("n\r")  # "y" would start a browser on the test machine
        assert finished(child) == 0
    finally:
        child.close()
    screen = log.getvalue()
    assert "Log in" + terminal_safe(HOSTILE) in screen
    assert "https://example.com/" + terminal_safe(HOSTILE) in screen  # the URL as it would be opened
    assert not any(raw in screen for raw in RAW), screen


def test_escapes_in_a_sampling_request_are_shown_not_run(isolated_home, smollm2_path, tmp_path):
    server = written(tmp_path, "asking_server.py", ASKING_SERVER)
    args = ("ask", "-m", str(smollm2_path), *FORCED, "--mcp", server, "--tool-choice", "python_hostile_sample")
    child = spawned(isolated_home, *args, "--approve-tools", "Ask the server.")
    log = recorded(child)
    try:
        child.expect_exact(SAMPLING_QUESTION)
        child.send("n\r")
        assert finished(child) == 0
    finally:
        child.close()
    screen = log.getvalue()
    assert "  system: Be brief" + terminal_safe(HOSTILE) in screen
    assert "  user: Say hi" + terminal_safe(HOSTILE) in screen
    assert not any(raw in screen for raw in RAW), screen


# --- a server given with --mcp whose name the config has -----------------------------------------


def _config(home: Path, server: Path, approve: str = "ask") -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        f"[mcp.python]\ncommand = {json.dumps(sys.executable)}\nargs = [{json.dumps(str(server))}]\n"
        f"approve = {json.dumps(approve)}\n",
        encoding="utf-8",
    )


def test_an_ad_hoc_server_named_like_a_configured_one_is_that_server(cli, isolated_home, smollm2_path):
    """`[mcp.python]` approves everything; `--mcp` gives the same program and arguments: it is that
    server, so its call and its sampling request run without asking (and no notice advises the
    setting that is already there)."""
    sampler = Path(__file__).with_name("sampling_server.py")
    _config(isolated_home, sampler, approve="always")
    run = cli(
        "ask",
        "-m",
        str(smollm2_path),
        *FORCED,
        *("--mcp", f"{sys.executable} {sampler}", "--tool-choice", "python_complete", "--json"),
        "Ask the server to name a colour.",
    )
    assert run.returncode == 0, run.stderr
    assert "config table" not in run.stderr, run.stderr
    [call] = json.loads(run.stdout)["tool_calls"]
    assert call["approved"] is True, call
    assert json.loads(call["result"])["model"] == "SmolLM2-135M-Instruct.Q4_1"


def test_an_ad_hoc_server_whose_name_a_configured_one_has_is_refused_in_one_line(cli, isolated_home, tmp_path):
    configured = Path(__file__).with_name("sampling_server.py")
    _config(isolated_home, configured)
    other = tmp_path / "python.py"  # named `python` too, as every server run by its interpreter is
    other.write_text("", encoding="utf-8")
    spec = f"{sys.executable} {other}"
    for command in (("ask", "--mcp", spec, "Hi"), ("mcp", "tools", "--mcp", spec)):
        run = cli(*command)
        assert run.returncode == 2 and run.stdout == "", run.stderr
        assert run.stderr.splitlines() == [
            f"llmchat: error: --mcp {spec}: the name python is taken by [mcp.python] in the config, which runs "
            f"{sys.executable} {configured}; use that one with -T mcp:python, or rename the table [mcp.python]"
        ]
