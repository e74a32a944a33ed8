"""The documentation cannot drift from the code: docs/cli.md is every command's `--help` as the
command line prints it, every option is in it, and no relative link in the Markdown pages points
at a file or a heading that is not there.

No model is loaded: the help is rendered from the command declarations, in-process.
"""

from __future__ import annotations

import importlib.util
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "BENCHMARKS.md", *(ROOT / "docs").glob("*.md")])


def _generator():
    spec = importlib.util.spec_from_file_location("generate_cli", ROOT / "docs" / "generate_cli.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- the command-line reference -------------------------------------------------------------------
def test_the_cli_reference_is_current():
    generator = _generator()
    written = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert written == generator.reference(), f"docs/cli.md is stale: regenerate it with `{generator.REGENERATE}`"


def test_each_page_is_what_help_prints(monkeypatch, capsys):
    """The generator renders each command as `llmchat ... --help` prints it (on a terminal 80 or
    more columns wide), through the same entry point a user's command line takes."""
    from llmchat.cli import main
    from llmchat.env import Environment

    monkeypatch.setenv("COLUMNS", "200")
    pages = _generator().help_pages()
    assert len(pages) > 40
    for path, text in pages:
        with pytest.raises(SystemExit) as done:
            main([*path.split()[1:], "--help"], Environment(stdout=io.StringIO(), stderr=io.StringIO()))
        assert done.value.code in (0, None), path
        assert capsys.readouterr().out == text + "\n", f"{path} --help differs from docs/cli.md's page"


def test_every_option_of_every_command_is_in_the_reference():
    import typer.main

    from llmchat.cli import full_app

    reference = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    sections = dict(re.findall(r"^## `([^`]+)`\n\n```text\n(.*?)\n```", reference, flags=re.M | re.S))
    seen = 0

    def walk(command, path: str) -> None:
        nonlocal seen
        page = sections[path]
        for param in command.params:
            if getattr(param, "hidden", False):  # a kept alias (--no-flash-attn): not shown on purpose
                continue
            for name in [*param.opts, *getattr(param, "secondary_opts", ())]:
                if param.param_type_name == "option":
                    assert re.search(rf"(^|[\s,/]){re.escape(name)}([\s,=]|$)", page, flags=re.M), f"{path}: {name}"
                    seen += 1
        for sub, subcommand in getattr(command, "commands", {}).items():
            walk(subcommand, f"{path} {sub}")

    walk(typer.main.get_command(full_app()), "llmchat")
    assert seen > 200


def test_ask_help_is_grouped_in_panels():
    page = dict((path, text) for path, text in _generator().help_pages())["llmchat ask"]
    headings = re.findall(r"^([A-Z][A-Za-z ]+):$", page, flags=re.M)
    assert headings == [
        "Arguments",
        "Model and engine",
        "Prompt and sampling",
        "Context and history",
        "Files and media",
        "Tools and MCP",
        "Reasoning models",
        "Structured output",
        "Servers",
        "Output",
        "Options",
    ]
    # One column for the help texts down the whole page.
    starts = {len(line) - len(line.lstrip()) for line in page.splitlines() if line.startswith("  -")}
    assert starts == {2}
    matches = [re.match(r"  -\S.{0,28}?\s{2,}(\S)", line) for line in page.splitlines()]
    columns = {m.start(1) for m in matches if m}
    assert len(columns) == 1, columns


# --- links ----------------------------------------------------------------------------------------
def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation out, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _without_code(text: str) -> str:
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
    anchors: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.M):
        slug, n = _slug(heading), 1
        while slug in anchors:  # GitHub numbers a repeated heading's anchor: name-1, name-2
            slug, n = f"{_slug(heading)}-{n}", n + 1
        anchors.add(slug)
    return anchors


def broken_links(pages: list[Path], root: Path = ROOT) -> list[str]:
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", _without_code(page.read_text(encoding="utf-8"))):
            if re.match(r"[a-z]+:", target):  # https:, mailto:: not checked (no network in tests)
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(root)}: ({target})"
            if not linked.exists():
                broken.append(f"{where}: no file {path}")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
                broken.append(f"{where}: no heading #{anchor} in {linked.relative_to(root)}")
    return broken


def test_no_relative_link_is_broken():
    assert len(PAGES) > 10
    assert broken_links(PAGES) == []


def test_the_link_check_sees_a_missing_file_and_a_missing_heading(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other\n\n## Two words: here\n")
    page.write_text(
        "# Page\n[ok](other.md#two-words-here) [self](#page) [gone](missing.md) [no](other.md#nowhere)\n"
        "`[in code](missing.md)`\n```\n[in a block](missing.md)\n```\n"
    )
    assert broken_links([page], tmp_path) == [
        "page.md: (missing.md): no file missing.md",
        "page.md: (other.md#nowhere): no heading #nowhere in other.md",
    ]


# --- the README ---------------------------------------------------------------------------------
def test_the_readme_is_short_and_starts_with_the_two_commands():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250 and len(readme.encode()) <= 24 * 1024
    commands = re.findall(r"^```sh\n(.*?)\n```", readme, flags=re.M | re.S)
    assert commands[:2] == [
        'pip install ".[default-model]" && llmchat ask "Why is the sky blue?"',
        'pip install -e ".[test]" && bash tests/servers/build.sh && python -m pytest -q',
    ]
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)\)", readme))
    on_disk = {page.name for page in (ROOT / "docs").glob("*.md")}
    assert on_disk <= linked, f"pages the README's index leaves out: {sorted(on_disk - linked)}"
