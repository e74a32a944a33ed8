"""MCP servers over a run's life, on real servers (tests/data/mcp/changing_server.py, the SDK's
MCPServer as a real process) and the real model (SmolLM2; the calls forced with `--tool-choice
required` on a server that offers one tool at a time, so no assertion rests on free model text):
- a server that cannot start is one line naming it and why, and the run goes on with the other
  tools (or none); what the user asked of that server (-f, -p, a forced tool) is exit 2;
- a server that changes its tools (notifications/tools/list_changed) has them offered again from
  the next turn of a chat, with one notice;
- a server used for tools and for resources and prompts starts once.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent / "data" / "mcp"
GONE = "/nonexistent/mcp-server-gone"
FORCED = ("--temperature", "0", "--seed", "1", "--no-history", "--max-tokens", "24", "--chain-limit", "1")
GONE_LINE = f"llmchat: MCP server gone ({GONE}) did not start: program not found ({GONE}); going on without its tools"


@pytest.fixture
def starts(isolated_home, tmp_path) -> Path:
    """A config with [mcp.changing] (each start appends a line to the returned file), [mcp.gone]
    (no such program) and [mcp.broken] (exits at once, saying why on stderr)."""
    log = tmp_path / "starts.log"
    isolated_home.mkdir(parents=True, exist_ok=True)
    python = json.dumps(sys.executable)
    (isolated_home / "config.toml").write_text(
        f"[mcp.changing]\ncommand = {python}\nargs = [{json.dumps(str(DATA / 'changing_server.py'))}]\n"
        f"env = {{ START_LOG = {json.dumps(str(log))} }}\n\n"
        f"[mcp.gone]\ncommand = {json.dumps(GONE)}\n\n"
        f'[mcp.broken]\ncommand = {python}\nargs = ["-c", "import sys; sys.exit(\'cannot run\')"]\n',
        encoding="utf-8",
    )
    return log


def started(log: Path) -> int:
    return len(log.read_text(encoding="utf-8").splitlines()) if log.exists() else 0


# --- no model -------------------------------------------------------------------------------------


def test_a_toolset_keeps_a_dead_server_aside_and_sources_share_its_connections(starts, isolated_home):
    from mcp_servers import free_port

    from llmchat.config import load_config
    from llmchat.errors import UsageError
    from llmchat.tools.mcp.sources import McpSources
    from llmchat.tools.registry import gather_tools

    with (isolated_home / "config.toml").open("a", encoding="utf-8") as config_file:  # nothing listens there
        config_file.write(f'\n[mcp.refusing]\nurl = "http://127.0.0.1:{free_port()}/mcp"\n')
    config = load_config()
    wanted = ["mcp:changing", "mcp:gone", "mcp:broken", "mcp:refusing"]
    with gather_tools(config, wanted, keep_going=True) as toolset:
        assert list(toolset.tools) == ["changing_step_one"]
        assert sorted(toolset.down) == ["broken", "gone", "refusing"]
        assert "could not be reached: no connection" in str(toolset.down["refusing"])  # after its retries
        assert "did not start: " in str(toolset.down["broken"])
        assert str(toolset.down["broken"]).endswith("its stderr ends: cannot run")
        with McpSources(config, shared=toolset) as sources:
            assert sources.resource_bytes("mcp:changing/note://greeting") == b"Hello from the changing server."
            with pytest.raises(UsageError, match=r"^MCP server gone \(/nonexistent/mcp-server-gone\) did not start"):
                sources.resource_bytes("mcp:gone/note://x")
        assert started(starts) == 1  # the resource came through the tools' connection
        # A server that said its tools changed is listed again, and says what changed.
        assert toolset.tools["changing_step_one"].run({}, 30) == "step one done"
        [change] = toolset.refresh_changed()
        assert change.notice() == "MCP server changing changed its tools: +changing_step_two -changing_step_one"
        assert list(toolset.tools) == ["changing_step_two"] and not toolset.refresh_changed()
    with pytest.raises(UsageError, match="did not start"):  # without keep_going (tools list): exit 2 as before
        gather_tools(config, ["mcp:gone"])


def test_a_server_opened_for_its_resources_only_lists_no_tools(starts):
    from llmchat.config import load_config
    from llmchat.tools.mcp.sources import McpSources

    with McpSources(load_config()) as sources:
        assert sources.prompt_text("mcp:changing/greet", {"name": "Ann"}) == "Say hello to Ann."
        assert sources.connection("changing").tools == []
    assert started(starts) == 1


def test_what_the_user_asked_of_a_dead_server_is_exit_2_before_the_load(cli, starts):
    # The model path does not exist: each line must come before anything loads.
    model = ("-m", "/nonexistent/model.gguf")
    cases = [
        (
            ("ask", *model, "-T", "mcp:gone", "-T", "mcp:changing", "--tool-choice", "gone_read", "hi"),
            "--tool-choice gone_read: MCP server gone",
        ),
        (("ask", *model, "-f", "mcp:gone/note://x", "hi"), "MCP server gone"),
        (("ask", *model, "-T", "mcp:gone", "-f", "mcp:gone/note://x", "hi"), "MCP server gone"),
        (("chat", *model, "-p", "mcp:gone/greet"), "MCP server gone"),
        (("ask", *model, "-T", "mcp:gone", "--tool-choice", "required", "hi"), "--tool-choice required: no tool"),
    ]
    for args, expected in cases:
        run = cli(*args)
        assert run.returncode == 2, (args, run.stderr)
        lines = run.stderr.splitlines()
        assert (
            len(lines) == 1
            and lines[0].startswith("llmchat: error: ")
            and expected in lines[0]
            and "Traceback" not in run.stderr
        ), (args, run.stderr)
        assert "model.gguf" not in run.stderr  # nothing loaded
    calls = cli("mcp", "call", "gone", "read")  # aimed at the server itself: exit 2 as before
    assert calls.returncode == 2 and calls.stderr.startswith("llmchat: error: MCP server gone")


# --- through the model ----------------------------------------------------------------------------


@pytest.mark.slow
def test_dead_servers_are_one_line_each_and_the_turn_uses_the_others_started_once(cli, smollm2_path, starts):
    """Two servers that cannot start, and one used for its tools, a resource and a prompt."""
    run = cli(
        "ask",
        "-m",
        str(smollm2_path),
        *FORCED,
        *("-T", "mcp:gone", "-T", "mcp:broken", "-T", "mcp:changing"),
        *("-f", "mcp:changing/note://greeting", "-p", "mcp:changing/greet", "--prompt-arg", "name=Ann"),
        *("--tool-choice", "required", "--approve-tools", "--json"),
    )
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    lines = run.stderr.splitlines()
    assert lines.count(GONE_LINE) == 1
    [broken] = [line for line in lines if line.startswith("llmchat: MCP server broken")]
    assert "did not start: " in broken and broken.endswith("its stderr ends: cannot run; going on without its tools")
    record = json.loads(run.stdout)
    [call] = record["tool_calls"]
    assert call["name"] == "changing_step_one" and call["result"] == "step one done"
    assert started(starts) == 1  # tools, resource and prompt: one start


@pytest.mark.slow
def test_with_every_server_dead_the_turn_runs_without_tools(cli, smollm2_path, starts):
    run = cli("ask", "-m", str(smollm2_path), *FORCED, "-T", "mcp:gone", "--json", "Say hi.")
    assert run.returncode == 0, run.stderr
    assert run.stderr.splitlines().count(GONE_LINE) == 1
    record = json.loads(run.stdout)
    assert not record.get("tool_calls") and not record["stats"].get("rounds")  # a plain turn: no tool rounds


@pytest.mark.slow
def test_a_changed_tool_list_is_offered_from_the_next_turn_of_a_chat(cli, smollm2_path, starts):
    """Turn 1 must call step_one (the only tool), which swaps it for step_two; turn 2 must call
    step_two: the offer was listed again between the turns, with one notice."""
    run = cli(
        "chat",
        "-m",
        str(smollm2_path),
        *FORCED,
        *("-T", "mcp:changing", "--tool-choice", "required", "--approve-tools", "--json"),
        input="Take the first step.\nTake the next step.\n",
    )
    assert run.returncode == 0, run.stderr
    first, second = (json.loads(line) for line in run.stdout.splitlines())
    assert [call["name"] for call in first["tool_calls"]] == ["changing_step_one"]
    assert [call["name"] for call in second["tool_calls"]] == ["changing_step_two"]
    assert second["tool_calls"][0]["result"] == "step two done"
    notice = "MCP server changing changed its tools: +changing_step_two -changing_step_one"
    assert run.stderr.splitlines().count(notice) == 1
    assert started(starts) == 1


@pytest.mark.slow
def test_a_piped_chat_with_no_lines_treats_an_mcp_prompt_as_a_saved_prompt(cli, smollm2_path, starts, isolated_home):
    """`chat -p NAME` with nothing on stdin runs no turn and saves nothing; `-p mcp:SERVER/NAME`
    (its text goes with the first line) does the same: exit 0, nothing on stdout, no conversation."""
    with (isolated_home / "config.toml").open("a", encoding="utf-8") as config_file:
        config_file.write('\n[prompts.reviewer]\nsystem = "You review code."\n')
    runs = {
        prompt: cli("chat", "-m", str(smollm2_path), "-p", prompt, *args, input="\n")
        for prompt, args in (("reviewer", ()), ("mcp:changing/greet", ("--prompt-arg", "name=Ann")))
    }
    for prompt, run in runs.items():
        assert (run.returncode, run.stdout) == (0, ""), (prompt, run.stderr)
        assert "Traceback" not in run.stderr
    assert json.loads(cli("history", "list", "--json").stdout) == []


@pytest.mark.slow
def test_a_forced_tool_that_is_gone_leaves_the_choice_to_the_model(cli, smollm2_path, starts):
    run = cli(
        "chat",
        "-m",
        str(smollm2_path),
        *FORCED,
        *("-T", "mcp:changing", "--tool-choice", "changing_step_one", "--approve-tools", "--json"),
        input="Take the first step.\nGo on.\n",
    )
    assert run.returncode == 0, run.stderr
    first, second = (json.loads(line) for line in run.stdout.splitlines())
    assert [call["name"] for call in first["tool_calls"]] == ["changing_step_one"]
    assert second["id"] == 2  # the second turn ran, the model choosing (its words are not asserted)
    lines = run.stderr.splitlines()
    assert lines.count("--tool-choice changing_step_one: that tool is gone; the model chooses (auto)") == 1
    assert lines.count("MCP server changing changed its tools: +changing_step_two -changing_step_one") == 1


@pytest.mark.slow
def test_a_batch_goes_on_without_a_dead_server(cli, smollm2_path, starts, tmp_path):
    items = tmp_path / "items.jsonl"
    items.write_text(json.dumps({"id": "step", "prompt": "Take the first step.", "tool_choice": "required"}) + "\n")
    run = cli(
        "batch",
        str(items),
        "-m",
        str(smollm2_path),
        *(option for option in FORCED if option != "--no-history"),
        "-T",
        "mcp:gone",
        "-T",
        "mcp:changing",
        "--approve-tools",
    )
    assert run.returncode == 0, run.stderr
    assert run.stderr.splitlines().count(GONE_LINE) == 1
    [record] = [json.loads(line) for line in run.stdout.splitlines()]
    assert [call["name"] for call in record["tool_calls"]] == ["changing_step_one"]


@pytest.mark.slow
def test_when_a_server_removes_its_last_tool_the_next_turn_is_a_plain_one(cli, smollm2_path, starts, isolated_home):
    config = isolated_home / "config.toml"
    config.write_text(config.read_text().replace("env = { START_LOG", 'env = { ONE_STEP = "1", START_LOG'))
    run = cli(
        "chat",
        "-m",
        str(smollm2_path),
        *FORCED,
        *("-T", "mcp:changing", "--tool-choice", "required", "--approve-tools", "--json"),
        input="Take the first step.\nGo on.\n",
    )
    assert run.returncode == 0, run.stderr
    first, second = (json.loads(line) for line in run.stdout.splitlines())
    assert [call["name"] for call in first["tool_calls"]] == ["changing_step_one"]
    assert not second.get("tool_calls") and not second["stats"].get("rounds")  # no tool rounds
    assert run.stderr.splitlines().count("MCP server changing changed its tools: -changing_step_one") == 1
