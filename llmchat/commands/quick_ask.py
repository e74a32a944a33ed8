"""A one-shot `llmchat ask` without Typer: its options read from the table of its declaration.

Typer (with the copy of click it vendors) is about 3 MiB of a one-shot `ask`'s peak RSS on a small
model (bench/oneshot_rss_parts.py), and part of its start-up, for parsing one command line. So
`llmchat.launch` hands an `ask` command line here first. `parse` reads it with the table that
llmchat.commands.ask.flags_table writes from the Typer declaration (llmchat.commands.ask_flags),
and only what it reads exactly as click would: long and short options, `--opt=value`, flags and
their `--no-` forms, repeated options, one prompt argument, `--`. Anything else (`--help`, an
unknown option, a value that is not a number where one is wanted, a value that starts with `-`,
short flags run together) gives None, and the command line goes to Typer, which runs it or says
what is wrong in its own words. tests/test_quick_ask.py checks, line by line, that both read the
same.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from llmchat.commands.ask_flags import ARGUMENT, OPTIONS, SHARED

if TYPE_CHECKING:
    from llmchat.env import Environment

_CONVERT = {"str": str, "int": int, "float": float, "path": Path}


def parse(args: list[str]) -> dict[str, Any] | None:
    """The parameters an `ask` command line gives (those it names only), or None where it is not
    one this reads exactly as click does."""
    given: dict[str, Any] = {}
    positional: list[str] = []
    words = iter(args)
    for word in words:
        if word == "--":
            positional.extend(words)
            break
        if not word.startswith("-") or word == "-":
            positional.append(word)
            continue
        # `--name=value`; a short option's `-fvalue` (or `-f=value`, value "=value") is Typer's.
        flag, has_value, value = word.partition("=") if word.startswith("--") else (word, "", "")
        entry = OPTIONS.get(flag)
        if entry is None:
            return None  # --help, an unknown option, short flags run together: Typer's to read
        name, kind = entry
        if kind in ("flag", "no-flag"):
            if has_value:
                return None
            given[name] = kind == "flag"
            continue
        if not has_value:
            following = next(words, None)
            if following is None:
                return None  # an option without its value: Typer says so
            value = following
        if value.startswith("-") and value != "-":
            return None  # click would take it as the value; a person more likely forgot one
        converted = _value(kind, value)
        if converted is None:
            return None
        if kind == "list":
            given.setdefault(name, []).append(converted)
        else:
            given[name] = converted
    if len(positional) > 1:
        return None
    if positional:
        given[ARGUMENT] = positional[0]
    return given


def _value(kind: str, text: str) -> Any:
    if kind == "list":
        return text
    if kind == "int>=0":
        number = _value("int", text)
        return number if number is not None and number >= 0 else None
    try:
        return _CONVERT[kind](text)
    except ValueError:
        return None


def runner(given: dict[str, Any], env: Environment | None = None) -> Callable[[], None]:
    """What runs the `ask` that `parse` read, as llmchat.cli would run it, in `env` (by default the
    process's own streams and config file), and ends the process. Its modules are imported here,
    while the caller (llmchat.launch) still turns an interrupt during an import into one line."""
    from llmchat.commands import ask_run
    from llmchat.commands.run_options import take_run_options
    from llmchat.env import Environment
    from llmchat.exits import run_guarded

    def run() -> None:
        environment = env if env is not None else Environment()

        def ask() -> None:
            arguments = dict(given)
            opts = take_run_options(arguments, SHARED, environment.config)
            ask_run.run(**arguments, opts=opts, env=environment)

        run_guarded(environment, ask, debug=bool(given.get("debug")))

    return run
