"""Tools that fit the context (issue 41): each tool's cost in prompt tokens, as the model's template
renders it, in `llmchat tools list` and the chat's /tools; picking tools with --tools, the config's
per-server `tools = [...]`, and /tool on|off NAME. Real parts: the bundled SmolLM2, real CLI runs,
mcp-server-time (PyPI) and server-everything (npm)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

FUNCTIONS = '''
def lookup(city: str, days: int = 1) -> str:
    """Weather for a city.

    Args:
        city: the city name
        days: how many days ahead
    """
    return city


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b
'''

TIME = "mcp-server-time --local-timezone UTC"
ROW = re.compile(r"^\s+([\d,]+)\s+[\d.]+%\s+(.*)$")


def functions_file(folder: Path) -> Path:
    path = folder / "weather.py"
    path.write_text(FUNCTIONS, encoding="utf-8")
    return path


def table_rows(stdout: str) -> list[tuple[int, str]]:
    """The token table's rows of `tools list`: (tokens, label), in order."""
    table = stdout[stdout.index("prompt tokens each tool adds") :]
    return [(int(m[1].replace(",", "")), m[2]) for line in table.splitlines() if (m := ROW.match(line))]


def prompt_tokens(cli, model: Path, *tool_args: str) -> int:
    """The prompt tokens of a real one-token `ask "Hello"` turn (the reference conversation)."""
    run = cli("ask", "-m", str(model), "--json", "--max-tokens", "1", "--no-history", *tool_args, "Hello")
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)["stats"]["prompt_tokens"]


def test_tools_list_counts_each_tool_per_source_and_in_all(cli, smollm2_path, tmp_path):
    functions = functions_file(tmp_path)
    args = ("tools", "list", "-m", str(smollm2_path), "--functions", str(functions), "--mcp", TIME)
    listing = cli(*args, "--json")
    assert listing.returncode == 0, listing.stderr
    tokens = {entry["name"]: entry["tokens"] for entry in json.loads(listing.stdout)}
    assert list(tokens) == ["lookup", "add", "time_get_current_time", "time_convert_time"]
    assert all(count > 0 for count in tokens.values()), tokens

    text = cli(*args)
    assert text.returncode == 0, text.stderr
    counted = next(line for line in text.stdout.splitlines() if line.startswith("prompt tokens each tool adds"))
    assert counted.endswith("counted with SmolLM2-135M-Instruct.Q4_1's template (GGUF tokenizer.chat_template):")
    rows = table_rows(text.stdout)
    assert rows[:2] == [(tokens["lookup"], "lookup"), (tokens["add"], "add")]
    assert rows[2] == (tokens["lookup"] + tokens["add"], "= functions:weather.py (2 tools)")
    assert rows[5] == (
        tokens["time_get_current_time"] + tokens["time_convert_time"],
        "= --mcp mcp-server-time (2 tools)",
    )
    total, label = rows[6]
    assert total == sum(tokens.values()) and label == "= all 4 tools, of a context of 8,192 tokens"
    assert rows[7][0] > 0 and rows[7][1].startswith("+ the template's tool block")


def test_the_prompt_with_all_tools_less_without_is_the_total_and_the_wrapper(cli, smollm2_path, tmp_path):
    """Compared: the prompt tokens of a real `ask "Hello"` turn with the four tools, less those of
    the same turn without tools, against the listing's total + its wrapper row. SmolLM2's template
    has no tool format (generic): the tools go into the system message, whose call example names the
    first tool (`lookup`, where the count's probe is named `probe`): that name is the only text the
    count does not see, so the two may differ by its tokens, at most 3."""
    functions = functions_file(tmp_path)
    tool_args = ("--functions", str(functions), "--mcp", TIME)
    text = cli("tools", "list", "-m", str(smollm2_path), *tool_args)
    assert text.returncode == 0, text.stderr
    rows = table_rows(text.stdout)
    total, wrapper = rows[6][0], rows[7][0]
    difference = prompt_tokens(cli, smollm2_path, *tool_args) - prompt_tokens(cli, smollm2_path)
    assert abs(difference - (total + wrapper)) <= 3, (difference, total, wrapper)


def test_tools_keeps_exactly_the_named_tools(cli, smollm2_path, tmp_path):
    functions = functions_file(tmp_path)
    picked = cli("tools", "list", "--json", "--functions", str(functions), "--mcp", TIME, "--tools", "time_get*,add")
    assert picked.returncode == 0, picked.stderr
    entries = json.loads(picked.stdout)
    assert [entry["name"] for entry in entries] == ["add", "time_get_current_time"]
    # The real turn's prompt holds those two and the wrapper: its tokens say which tools it rendered.
    tokens = {entry["name"]: entry["tokens"] for entry in entries}
    every = cli("tools", "list", "-m", str(smollm2_path), "--functions", str(functions), "--mcp", TIME)
    wrapper = table_rows(every.stdout)[7][0]
    without = prompt_tokens(cli, smollm2_path)
    with_two = prompt_tokens(
        cli, smollm2_path, "--functions", str(functions), "--mcp", TIME, "--tools", "time_get*,add"
    )
    assert abs(with_two - without - (sum(tokens.values()) + wrapper)) <= 3


def test_an_unknown_tool_name_is_one_line_and_exit_2(cli, smollm2_path, tmp_path):
    functions = functions_file(tmp_path)
    run = cli("ask", "-m", str(smollm2_path), "--functions", str(functions), "--tools", "nope", "hi")
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert lines == ["llmchat: error: --tools nope: no tool of that name is offered (offered: lookup, add)"]


def test_a_config_tools_key_keeps_those_of_its_server(cli, isolated_home):
    isolated_home.mkdir(parents=True, exist_ok=True)
    (isolated_home / "config.toml").write_text(
        '[mcp.time]\ncommand = "mcp-server-time"\ntools = ["get_current_time"]\n', encoding="utf-8"
    )
    run = cli("tools", "list", "--json", "-T", "mcp:time")
    assert run.returncode == 0, run.stderr
    assert [entry["name"] for entry in json.loads(run.stdout)] == ["time_get_current_time"]
    (isolated_home / "config.toml").write_text(
        '[mcp.time]\ncommand = "mcp-server-time"\ntools = ["nope"]\n', encoding="utf-8"
    )
    bad = cli("tools", "list", "-T", "mcp:time")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "llmchat: error: [mcp.time] tools nope: no tool of that name is offered "
        "(offered: time_get_current_time, time_convert_time)"
    ]


def test_globs_pick_among_server_everything(cli, npm_mcp_bin):
    server = str(npm_mcp_bin / "mcp-server-everything")
    every = cli("tools", "list", "--json", "--mcp", server)
    assert every.returncode == 0, every.stderr
    names = [entry["name"] for entry in json.loads(every.stdout)]
    picked = cli("tools", "list", "--json", "--mcp", server, "--tools", "everything_get-*")
    assert picked.returncode == 0, picked.stderr
    kept = [entry["name"] for entry in json.loads(picked.stdout)]
    assert kept and kept == [name for name in names if name.startswith("everything_get-")]


def test_slash_tool_off_name_leaves_it_out_of_the_next_prompt(smollm2_path, tmp_path):
    from rich.console import Console

    from llmchat.config import load_config
    from llmchat.options import RunOptions
    from llmchat.startup.loading import start_session
    from llmchat.tools.options import ToolRequest, offer
    from llmchat.tools.registry import gather_tools
    from llmchat.tools.token_cost import REFERENCE_CONVERSATION
    from llmchat.ui import slash
    from llmchat.ui.context import CommandContext

    functions = functions_file(tmp_path)
    session = start_session(
        RunOptions(model=str(smollm2_path), max_tokens=1), config=load_config(), overflow="drop", with_history=False
    )
    toolset = gather_tools(load_config(), functions_files=[str(functions)])
    try:
        offer(session, toolset, ToolRequest(functions=(str(functions),)))
        buffer = io.StringIO()
        errors: list[str] = []
        infos: list[str] = []
        ctx = CommandContext(session, out=Console(file=buffer, width=200), error=errors.append, info=infos.append)

        def prompt() -> tuple[str, int]:
            ids = session.tokenize_messages(list(REFERENCE_CONVERSATION))
            return session.engine.detokenize(ids), len(ids)

        slash.dispatch("/tools", ctx)
        rows = table_rows(buffer.getvalue())
        assert [label for _, label in rows[:2]] == ["lookup", "add"] and rows[2][0] == rows[0][0] + rows[1][0]
        before, before_tokens = prompt()
        assert '"name": "add"' in before and '"name": "lookup"' in before

        slash.dispatch("/tool off add", ctx)
        assert infos[-1] == "add off from the next message"
        after, after_tokens = prompt()
        assert '"name": "add"' not in after and '"name": "lookup"' in after
        assert before_tokens - after_tokens == rows[1][0]  # exactly the tokens /tools gave `add`

        slash.dispatch("/tool off nope", ctx)
        assert errors[-1] == "error: nope: no tool of that name (tools: lookup, add)"
        slash.dispatch("/tool on add", ctx)
        assert '"name": "add"' in prompt()[0]
    finally:
        toolset.close()
        session.close()
