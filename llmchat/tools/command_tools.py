"""`[tools.NAME]` in the config: a command the model may call, run as an argv list, never through a shell.

    [tools.weather]
    description = "Today's weather for a city"
    command = ["weather-cli", "--city", "{city}"]
    parameters = { type = "object", properties = { city = { type = "string" } }, required = ["city"] }
    timeout = 10            # seconds (default 30)
    approve = "always"      # run without asking (default "ask")
    env = { WEATHER_UNITS = "metric" }

How the arguments reach the command:
- each `{name}` in an argv element is replaced by that argument (strings as they are, other values
  as JSON); the element stays one argv element, whatever the value holds (no shell, no splitting);
  an element whose argument was not given is left out;
- the whole arguments object is also written to the command's stdin as one line of JSON.
The command's stdout is the result. A non-zero exit status is an error for the model, with the
last lines of stderr. It runs with a clean environment: PATH, HOME, LANG, LC_ALL, LC_CTYPE, TMPDIR
and USER from llmchat's own, plus the tool's `env` table; nothing else (no API keys) leaks in.

The command runs in a process group of its own, and the call ends that whole group
(llmchat.tools.process_group) when the command exits, at its timeout, and on Ctrl-C, SIGTERM or
any error while it runs: nothing it started in the background outlives the call, and a grandchild
holding its pipes cannot keep llmchat waiting. A Ctrl-C ends the call (and the turn) at once.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import subprocess
import time
from pathlib import Path
from typing import IO, Any

from llmchat.errors import ConfigError
from llmchat.tools.process_group import end_group
from llmchat.tools.spec import APPROVE_POLICIES, EMPTY_OBJECT_SCHEMA, ToolFailure, ToolSpec, ToolTimeout

PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
INHERITED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "USER")
# Memory bound while reading a command's output; the model gets far less (the output cap).
CAPTURE_LIMIT_BYTES = 1024 * 1024
READ_CHUNK = 65536
POLL_S = 0.02  # how often the command's exit is looked for where there is no pidfd
# After the command exited and its group was ended: how long its pipes may stay open (held by a
# process that left the group) before what was read is taken as all.
DRAIN_LIMIT_S = 0.5
REAP_LIMIT_S = 2.0
_KEYS = ("command", "description", "parameters", "timeout", "approve", "env", "max_output")


def command_tool(name: str, settings: Any, config_path: Path | str) -> ToolSpec:
    """The ToolSpec for one [tools.NAME] table; a wrong entry is one ConfigError line."""
    where = f"config file {config_path}: tools.{name}"
    if not isinstance(settings, dict):
        raise ConfigError(f"{where} must be a table with command, description and parameters")
    for key in settings:
        if key not in _KEYS:
            raise ConfigError(f"{where}: unknown key {key!r}; use {', '.join(_KEYS)}")
    argv = settings.get("command")
    if not isinstance(argv, list) or not argv or not all(isinstance(part, str) and part for part in argv):
        raise ConfigError(
            f'{where}: command must be a list of strings, the program first (command = ["prog", "{{arg}}"]); '
            "it runs without a shell"
        )
    description = settings.get("description", "")
    if not isinstance(description, str):
        raise ConfigError(f"{where}: description must be a string")
    parameters = _parameters(settings.get("parameters", EMPTY_OBJECT_SCHEMA), where)
    known = set(parameters.get("properties", {}))
    for part in argv:
        for placeholder in PLACEHOLDER.findall(part):
            if placeholder not in known:
                raise ConfigError(
                    f"{where}: command uses {{{placeholder}}}, which is not a property of its parameters schema"
                )
    if PLACEHOLDER.search(argv[0]):
        raise ConfigError(f"{where}: the program (the first element of command) cannot come from an argument")
    approve = settings.get("approve", "ask")
    if approve not in APPROVE_POLICIES:
        raise ConfigError(f'{where}: approve must be "ask" or "always"')
    env = settings.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ConfigError(f'{where}: env must be a table of strings (env = {{ NAME = "value" }})')
    timeout = _positive_number(settings.get("timeout"), f"{where}: timeout")
    max_output = settings.get("max_output")
    if max_output is not None and (isinstance(max_output, bool) or not isinstance(max_output, int) or max_output < 1):
        raise ConfigError(f"{where}: max_output must be a whole number of bytes above 0")
    return ToolSpec(
        name=name,
        description=description,
        parameters=parameters,
        source=f"config:tools.{name}",
        run=lambda arguments, timeout_s: run_command(argv, arguments, timeout_s, env),
        approve=approve,
        timeout_s=timeout,
        max_output_bytes=max_output,
    )


def _parameters(value: Any, where: str) -> dict[str, Any]:
    """The parameters schema: a TOML table, or JSON text; it must describe an object."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{where}: parameters is not valid JSON ({err.msg})") from None
    if not isinstance(value, dict) or value.get("type", "object") != "object":
        raise ConfigError(f'{where}: parameters must be a JSON schema of type "object" (a table or JSON text)')
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(value)
    except SchemaError as err:
        raise ConfigError(f"{where}: parameters is not a valid JSON schema ({err.message})") from None
    return {"type": "object", **value}


def _positive_number(value: Any, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"{what} must be a number of seconds above 0")
    return float(value)


def clean_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {key: os.environ[key] for key in INHERITED_ENV if key in os.environ}
    env.update(extra or {})
    return env


def build_argv(template: list[str], arguments: dict[str, Any]) -> list[str]:
    """The argv for one call: placeholders filled, each element still one element."""
    argv: list[str] = []
    for part in template:
        names = PLACEHOLDER.findall(part)
        if any(name not in arguments or arguments[name] is None for name in names):
            continue  # an optional argument not given: leave the whole element out
        argv.append(PLACEHOLDER.sub(lambda match: _as_arg(arguments[match.group(1)]), part))
    return argv


def _as_arg(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def run_command(template: list[str], arguments: dict[str, Any], timeout_s: float, env: dict[str, str]) -> str:
    argv = build_argv(template, arguments)
    try:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=clean_environment(env),
            start_new_session=True,  # its own process group: it ends with everything it started
        )
    except OSError as err:
        raise ToolFailure(f"cannot start {argv[0]}: {err.strerror or err}") from None
    pipes = CommandPipes(process, json.dumps(arguments, ensure_ascii=False).encode() + b"\n")
    finished = False
    try:
        status = pipes.serve_until_exit(time.monotonic() + timeout_s)
        if status is None:
            raise ToolTimeout(f"{argv[0]} did not finish within {timeout_s:g} s and was stopped")
        finished = True
    finally:
        # Whatever ended the wait (the command's exit, its time limit, Ctrl-C, SIGTERM, an error),
        # its whole group ends now: also what it left running in the background, which may hold
        # the pipes open. Then what it wrote is read to the end of the pipes.
        end_group(process.pid, process.poll)
        _reap(process)
        if finished:
            pipes.drain(DRAIN_LIMIT_S)
        pipes.close()
    if status != 0:
        tail = pipes.stderr.text().strip().splitlines()[-5:]
        detail = ("; stderr: " + " | ".join(tail)) if tail else ""
        reason = f"was killed by signal {-status}" if status < 0 else f"exited with status {status}"
        raise ToolFailure(f"{argv[0]} {reason}{detail}")
    return pipes.stdout.text()


def _reap(process: subprocess.Popen) -> None:
    """Collect the command's exit (it was killed if it had not exited); bounded, in case it cannot die."""
    try:
        process.wait(REAP_LIMIT_S)
    except subprocess.TimeoutExpired:
        pass


class CommandPipes:
    """The command's three pipes, served from the calling thread while it runs: the arguments
    written to its stdin, its stdout and stderr read as they come (a command that floods them never
    blocks on a full pipe). No thread waits on a pipe: a grandchild that holds one open cannot keep
    the call (or a Ctrl-C) waiting. The command's exit is seen on a pidfd where the system has
    them, else by polling every POLL_S."""

    def __init__(self, process: subprocess.Popen, stdin_data: bytes):
        assert process.stdin is not None and process.stdout is not None and process.stderr is not None
        self.process = process
        self.stdout = BoundedCapture()
        self.stderr = BoundedCapture()
        self._unsent = memoryview(stdin_data)
        self._selector = selectors.DefaultSelector()
        self._captures = {process.stdout.fileno(): self.stdout, process.stderr.fileno(): self.stderr}
        self._files: dict[int, IO[bytes]] = {
            process.stdin.fileno(): process.stdin,
            process.stdout.fileno(): process.stdout,
            process.stderr.fileno(): process.stderr,
        }
        os.set_blocking(process.stdin.fileno(), False)
        self._selector.register(process.stdin.fileno(), selectors.EVENT_WRITE)
        for fd in self._captures:
            self._selector.register(fd, selectors.EVENT_READ)
        self._exit_fd: int | None = None
        try:
            self._exit_fd = os.pidfd_open(process.pid)
            self._selector.register(self._exit_fd, selectors.EVENT_READ)
        except (AttributeError, OSError):  # not Linux 5.3+: poll
            self._exit_fd = None

    def serve_until_exit(self, deadline: float) -> int | None:
        """Serve the pipes until the command exits: its status, or None at the deadline."""
        while True:
            status = self.process.poll()
            if status is not None:
                self._forget_exit_fd()
                return status
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self._serve(remaining if self._exit_fd is not None else min(remaining, POLL_S))

    def drain(self, limit_s: float) -> None:
        """Read what is left in stdout and stderr, to their end; at most `limit_s` (a process that
        left the command's group may hold them open)."""
        deadline = time.monotonic() + limit_s
        while any(fd in self._captures for fd in self._open_fds()):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._serve(remaining)

    def close(self) -> None:
        self._forget_exit_fd()
        for fd in list(self._open_fds()):
            self._close(fd)
        self._selector.close()

    def _open_fds(self) -> list[int]:
        return [key.fd for key in self._selector.get_map().values() if key.fd != self._exit_fd]

    def _serve(self, timeout_s: float) -> None:
        for key, _events in self._selector.select(timeout_s):
            if key.fd == self._exit_fd:
                continue  # the command exited: the caller's poll() sees it
            if key.fd in self._captures:
                data = os.read(key.fd, READ_CHUNK)
                if data:
                    self._captures[key.fd].add(data)
                else:
                    self._close(key.fd)
            else:
                self._write_stdin(key.fd)

    def _write_stdin(self, fd: int) -> None:
        try:
            self._unsent = self._unsent[os.write(fd, self._unsent) :]
        except BlockingIOError:
            return
        except OSError:  # the command does not read stdin, or exited first: fine
            self._unsent = memoryview(b"")
        if not self._unsent:
            self._close(fd)  # the end of its stdin

    def _close(self, fd: int) -> None:
        self._selector.unregister(fd)
        try:
            self._files[fd].close()
        except OSError:
            pass

    def _forget_exit_fd(self) -> None:
        if self._exit_fd is not None:
            self._selector.unregister(self._exit_fd)
            os.close(self._exit_fd)
            self._exit_fd = None


class BoundedCapture:
    """What one pipe gave, keeping the first CAPTURE_LIMIT_BYTES (a command that floods its output
    cannot fill memory)."""

    def __init__(self) -> None:
        self.kept = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = CAPTURE_LIMIT_BYTES - len(self.kept)
        if room > 0:
            self.kept.extend(chunk[:room])

    def text(self) -> str:
        text = self.kept.decode("utf-8", errors="replace")
        if self.total > len(self.kept):
            text += f"\n[{self.total - len(self.kept)} more bytes not read]"
        return text
