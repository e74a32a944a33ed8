"""The client command of the MCP conformance suite (tests/test_mcp_conformance.py): llmchat, run as a
person runs it, against the suite's mock server for one scenario.

The suite runs `PYTHON tests/mcp_conformance_client.py SERVER_URL` with the scenario's name in
MCP_CONFORMANCE_SCENARIO and, for some, a JSON object in MCP_CONFORMANCE_CONTEXT (pre-registered
client credentials, the tool calls to make). This script writes a config naming the server
(`[mcp.conformance]`) into a fresh LLMCHAT_HOME and runs llmchat's own commands on it, each in a
process of its own: `llmchat mcp tools`, `llmchat mcp call`, `llmchat mcp resources`, `llmchat mcp
prompts`, and `llmchat mcp login` where a command says to log in. For the login it is the browser:
it GETs the address llmchat prints and follows the redirects back to llmchat's loopback listener
(the suite's authorization server approves at once). It never talks to the server itself.

Exit 0 when every command did what a person would expect; else 1, with each command's stderr on
this script's stderr (the suite keeps it with the scenario's results).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

SERVER = "conformance"
REPO = Path(__file__).resolve().parent.parent
# The most one llmchat command may take (the test passes its own down; the scenarios take turns,
# one_at_a_time, so this bounds llmchat, not the wait for a turn).
STEP_TIMEOUT_S = float(os.environ.get("LLMCHAT_CONFORMANCE_STEP_TIMEOUT_S", "25"))
LOGINS = 3  # the most logins one scenario asks for: a server that always wants more scope cannot loop
LOGIN_ASKED = f"llmchat mcp login {SERVER}"
# A client ID metadata document's address (SEP-991) the suite's authorization server accepts
# without fetching it: the suite's CIMD_CLIENT_METADATA_URL.
CLIENT_METADATA_URL = "https://conformance-test.local/client-metadata.json"


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str


def llmchat(*args: str) -> Run:
    """One llmchat command in a process of its own, as typed at a shell with nothing on stdin."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "llmchat", *args],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=STEP_TIMEOUT_S,
        )
        run = Run(done.returncode, done.stdout, done.stderr)
    except subprocess.TimeoutExpired:  # the command was killed: the step failed, the scenario goes on
        run = Run(124, "", f"(no end within {STEP_TIMEOUT_S:g} s: killed)\n")
    sys.stderr.write(f"$ llmchat {' '.join(args)}\n-> exit {run.returncode}\n{run.stderr}")
    return run


def log_in() -> Run:
    """`llmchat mcp login conformance --no-browser`, with this script as the browser: it reads the
    address from llmchat's stderr and GETs it, following the redirects to llmchat's listener."""
    process = subprocess.Popen(
        [sys.executable, "-m", "llmchat", "mcp", "login", SERVER, "--no-browser", "--timeout", f"{STEP_TIMEOUT_S:g}"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    seen: list[str] = []
    try:
        while (line := lines.get(timeout=STEP_TIMEOUT_S)) is not None:  # the event: a line from llmchat
            seen.append(line)
            if "in your browser: " in line:
                seen.append(browse(line.split("in your browser: ", 1)[1].strip()))
        process.wait(timeout=STEP_TIMEOUT_S)
    except (queue.Empty, subprocess.TimeoutExpired):
        seen.append(f"(no end within {STEP_TIMEOUT_S:g} s: killed)\n")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    sys.stderr.write(f"$ llmchat mcp login {SERVER} --no-browser\n-> exit {process.returncode}\n{''.join(seen)}")
    assert process.stdout is not None
    return Run(process.returncode, process.stdout.read(), "".join(seen))


def browse(address: str) -> str:
    """What a browser does with the address: follows the redirects (the authorization server
    approves at once and sends it back to llmchat's listener). What it saw, for the log."""
    try:
        with httpx.Client(timeout=STEP_TIMEOUT_S, follow_redirects=True, max_redirects=5) as browser:
            page = browser.get(address)
    except httpx.HTTPError as err:
        return f"(browser: {type(err).__name__}: {err})\n"
    return f"(browser: {page.status_code} {page.text.strip()[:200]})\n"


class Person:
    """Runs commands the way a person does: when one says to log in, logs in and runs it again."""

    def __init__(self) -> None:
        self.logins = 0
        self.failed = False

    def run(self, *args: str) -> Run:
        done = llmchat(*args)
        while done.returncode != 0 and LOGIN_ASKED in done.stderr and self.logins < LOGINS:
            self.logins += 1
            if log_in().returncode != 0:
                break
            done = llmchat(*args)
        if done.returncode != 0:
            self.failed = True
        return done

    def tools(self) -> dict[str, Any]:
        done = self.run("mcp", "tools", SERVER, "--json")
        if done.returncode != 0:
            return {}
        return {record["name"][len(SERVER) + 1 :]: record for record in json.loads(done.stdout)}

    def call(self, tool: str, arguments: dict[str, Any] | None = None) -> Run:
        return self.run("mcp", "call", SERVER, tool, "--args", json.dumps(arguments or {}), "--json")


def write_config(home: Path, url: str, scenario: str, context: dict[str, Any]) -> None:
    lines = [f"[mcp.{SERVER}]", f"url = {json.dumps(url)}", 'approve = "always"', f"timeout = {STEP_TIMEOUT_S - 5:g}"]
    if scenario == "elicitation-sep1034-client-defaults":
        lines.append('elicitation = "defaults"')  # as a user automating llmchat sets it: forms take their defaults
    if context.get("client_id"):
        lines.append(f"client_id = {json.dumps(context['client_id'])}")
    if context.get("client_secret"):
        lines.append('client_secret_env = "CONFORMANCE_CLIENT_SECRET"')
        os.environ["CONFORMANCE_CLIENT_SECRET"] = context["client_secret"]
    if scenario.startswith("auth/") and not context.get("client_id"):
        lines.append(f"client_metadata_url = {json.dumps(CLIENT_METADATA_URL)}")
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text("\n".join(lines) + "\n", encoding="utf-8")


def play(scenario: str, context: dict[str, Any], person: Person) -> None:
    """What a person would do to exercise what the scenario is about."""
    tools = person.tools()
    if person.failed:
        return
    if scenario == "tools_call":
        person.call("add_numbers", {"a": 5, "b": 3})
    elif scenario == "sse-retry":
        person.call("test_reconnection")
    elif scenario == "elicitation-sep1034-client-defaults":
        person.call("test_client_elicitation_defaults")
    elif scenario == "json-schema-2020-12-preservation":
        focal = tools.get("json_schema_2020_12_tool")
        person.call("json_schema_echo", {"schema": focal["parameters"] if focal else {}})
    elif scenario == "http-standard-headers":
        for tool in tools:
            person.call(tool)
        person.run("mcp", "resources", SERVER)
        person.run("mcp", "prompts", SERVER)
    elif scenario == "sep-2322-client-request-state":
        for tool in tools:
            person.call(tool)
    elif scenario == "http-invalid-tool-headers":
        person.call("valid_tool", {"region": "us-west1"})  # the one tool listed: the others are invalid
    elif context.get("toolCalls"):
        for call in context["toolCalls"]:
            person.call(call["name"], call.get("arguments") or {})
    elif scenario.startswith("auth/"):
        person.call("test-tool")


def one_at_a_time() -> Any:
    """The suite starts every scenario's client at once; on a machine of 2 cores 40 of them starting
    llmchat together each take minutes, and a scenario that measures time (sse-retry) fails for it.
    With LLMCHAT_CONFORMANCE_LOCK set (the test sets it), each client waits for that lock first, so
    the scenarios' llmchat runs take turns while the suite's mock servers wait."""
    lock_path = os.environ.get("LLMCHAT_CONFORMANCE_LOCK")
    if not lock_path:
        return contextlib.nullcontext()
    lock = open(lock_path, "w")  # closed, and so released, when this process ends

    fcntl.flock(lock, fcntl.LOCK_EX)
    return lock


def main() -> int:
    url = sys.argv[-1]
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    with one_at_a_time(), tempfile.TemporaryDirectory(prefix="llmchat-conformance-") as folder:
        home = Path(folder) / "home"
        write_config(home, url, scenario, context)
        os.environ["LLMCHAT_HOME"] = str(home)
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        person = Person()
        play(scenario, context, person)
    return 1 if person.failed else 0


if __name__ == "__main__":
    sys.exit(main())
