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
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
from pathlib import Path
from typing import IO, Any

from llmchat.errors import ConfigError
from llmchat.tools.spec import APPROVE_POLICIES, EMPTY_OBJECT_SCHEMA, ToolFailure, ToolSpec, ToolTimeout

PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
INHERITED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "USER")
# Memory bound while reading a command's output; the model gets far less (the output cap).
CAPTURE_LIMIT_BYTES = 1024 * 1024
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
            start_new_session=True,  # its own process group: a timeout ends the children too
        )
    except OSError as err:
        raise ToolFailure(f"cannot start {argv[0]}: {err.strerror or err}") from None
    stdout = _BoundedReader(process.stdout)
    stderr = _BoundedReader(process.stderr)
    # Written from a thread: a command that never reads stdin must not block us on a full pipe.
    feeder = threading.Thread(
        target=_feed, args=(process.stdin, json.dumps(arguments, ensure_ascii=False).encode() + b"\n"), daemon=True
    )
    feeder.start()
    try:
        status = process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        raise ToolTimeout(f"{argv[0]} did not finish within {timeout_s:g} s and was stopped") from None
    finally:
        # A background child that inherited the pipes may hold them open: wait a bounded time.
        stdout.join(timeout_s)
        stderr.join(timeout_s)
    if status != 0:
        tail = stderr.text().strip().splitlines()[-5:]
        detail = ("; stderr: " + " | ".join(tail)) if tail else ""
        reason = f"was killed by signal {-status}" if status < 0 else f"exited with status {status}"
        raise ToolFailure(f"{argv[0]} {reason}{detail}")
    return stdout.text()


def _feed(pipe: IO[bytes] | None, data: bytes) -> None:
    if pipe is None:
        return
    try:
        with pipe:
            pipe.write(data)
    except (BrokenPipeError, OSError):
        pass  # the command does not read stdin, or exited first: fine


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()


class _BoundedReader:
    """Reads a pipe to its end in a thread, keeping the first CAPTURE_LIMIT_BYTES (a command that
    floods its output cannot fill memory, and never blocks on a full pipe)."""

    def __init__(self, pipe: IO[bytes] | None):
        self.kept = bytearray()
        self.total = 0
        self._thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._thread.start()

    def _read(self, pipe: IO[bytes] | None) -> None:
        if pipe is None:
            return
        with pipe:
            while chunk := pipe.read(65536):
                self.total += len(chunk)
                room = CAPTURE_LIMIT_BYTES - len(self.kept)
                if room > 0:
                    self.kept.extend(chunk[:room])

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)

    def text(self) -> str:
        text = self.kept.decode("utf-8", errors="replace")
        if self.total > len(self.kept):
            text += f"\n[{self.total - len(self.kept)} more bytes not read]"
        return text
