"""Write docs/cli.md, the command-line reference: every command's `--help`, as llmchat prints it.

    python docs/generate_cli.py           # write docs/cli.md
    python docs/generate_cli.py --check   # exit 1 when docs/cli.md is not what the code prints

tests/test_docs.py runs the check, so the reference cannot drift from the code: a change to an
option's name, default, help text or panel fails it until this script is run again. Each page is
what `llmchat ... --help` prints on a terminal 80 columns wide or wider (click writes 78 columns),
in click's plain format: no colour, no boxes.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "cli.md"
WIDTH = 78  # click: min(the terminal's columns, 80) - 2
REGENERATE = "python docs/generate_cli.py"


def help_pages() -> list[tuple[str, str]]:
    """(command path, its --help) for `llmchat` and every command and subcommand, in the order
    `llmchat --help` lists them."""
    sys.path.insert(0, str(ROOT))  # this checkout's llmchat, also when run as a script
    import typer
    import typer.main

    from llmchat.cli import full_app

    pages: list[tuple[str, str]] = []

    def walk(command: Any, parent: Any, name: str) -> None:
        settings = {**command.context_settings, "terminal_width": WIDTH}  # as command.make_context applies them
        context = command.context_class(command, info_name=name, parent=parent, **settings)
        pages.append((context.command_path, command.get_help(context)))
        if hasattr(command, "list_commands"):  # a group: its commands, as its help lists them
            for sub in command.list_commands(context):
                walk(command.get_command(context, sub), context, sub)

    walk(typer.main.get_command(full_app()), None, "llmchat")
    return pages


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading of this page (`llmchat history list` -> llmchat-history-list)."""
    return heading.strip("`").lower().replace(" ", "-")


def reference() -> str:
    pages = help_pages()
    lines = [
        "# Command-line reference",
        "",
        f"Every command's `--help`, generated from the code by `{REGENERATE}` (a test fails when this",
        "page and the code disagree). The options are grouped in panels; [the manual](../README.md#the-manual)",
        "explains each feature.",
        "",
    ]
    lines += [f"- [`{path}`](#{anchor(path)})" for path, _ in pages]
    for path, text in pages:
        lines += ["", f"## `{path}`", "", "```text", *(line.rstrip() for line in text.splitlines()), "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    text = reference()
    if argv[1:] == ["--check"]:
        if REFERENCE.exists() and REFERENCE.read_text(encoding="utf-8") == text:
            return 0
        print(f"docs/cli.md is not what the code's --help prints; regenerate it: {REGENERATE}", file=sys.stderr)
        return 1
    if argv[1:]:
        print(f"usage: {REGENERATE} [--check]", file=sys.stderr)
        return 2
    REFERENCE.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
