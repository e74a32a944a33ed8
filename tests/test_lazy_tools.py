"""Tools that would take more than `lazy_tools` of the context, offered lazily (llmchat.tools.lazy),
with the generated MCP server of bench/many_tools_server.py and SmolLM2:
- past the share, the model gets `load_tool` (every tool's name and one-line description, the
  names as an enum) in place of the schemas, and the first prompt is that much shorter; below
  it, or with `lazy_tools = 1`, every schema as before;
- through `ask` as a user runs it: the forced first call loads a tool, which joins the offer, and
  the conversation's KV prefix breaks only in the round after a load, never otherwise.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from llmchat.tools.lazy import LOADER, loader_spec, one_line

SERVER = Path(__file__).resolve().parents[1] / "bench" / "many_tools_server.py"


def spec_of(count: int) -> str:
    return f"{sys.executable} {SERVER} {count}"


def test_one_line_takes_the_first_sentence_of_the_first_line():
    assert one_line("Search pages in the workspace. Works on the pages the caller may see.") == (
        "Search pages in the workspace."
    )
    assert one_line("\n  Echo back.\nMore text.") == "Echo back."
    assert one_line("x" * 300) == "x" * 119 + "…"


def test_the_loader_lists_each_tool_and_holds_its_name_to_them():
    from llmchat.tools.spec import EMPTY_OBJECT_SCHEMA, ToolSpec

    catalog = [
        ToolSpec("a_get", "Get an a. With details.", EMPTY_OBJECT_SCHEMA, "test", lambda arguments, timeout_s: ""),
        ToolSpec("b_list", "", EMPTY_OBJECT_SCHEMA, "test", lambda arguments, timeout_s: ""),
    ]
    asked: list[str] = []
    loader = loader_spec(LOADER, catalog, lambda name: asked.append(name) or f"{name} loaded")
    assert loader.description.endswith("The tools:\n- a_get: Get an a.\n- b_list")
    assert loader.parameters["properties"]["name"]["enum"] == ["a_get", "b_list"]
    assert loader.approve == "always"  # loading runs nothing of the tool's
    assert loader.run({"name": "b_list"}, 1.0) == "b_list loaded" and asked == ["b_list"]


@pytest.mark.slow
def test_past_the_share_the_first_prompt_has_the_names_not_the_schemas(smollm2_path):
    from llmchat.config import load_config
    from llmchat.options import RunOptions
    from llmchat.startup.loading import start_session
    from llmchat.tools.mcp.config import parse_mcp_spec
    from llmchat.tools.mcp.connection import McpConnection
    from llmchat.tools.offer import ToolIO, make_offer

    said: list[str] = []
    io = ToolIO(show_call=lambda text: None, notice=said.append)
    options = RunOptions(model=str(smollm2_path), ctx=4096, temperature=0.0, seed=1, max_tokens=16)
    session = start_session(options, config=load_config(), overflow="error", with_history=False)
    try:
        with McpConnection(parse_mcp_spec(spec_of(30))) as server:
            specs = list(server.tools)
            prompts = {}
            for share in (None, 1.0, 0.25):
                offer = make_offer(session, specs, io, lazy_share=share)
                session.use_tools(offer)
                prompts[share] = len(session.tokenize_messages([{"role": "user", "content": "Hello"}]))
                assert offer.lazily is (share == 0.25), share
            assert list(offer.specs) == [LOADER] and list(offer.catalog) == [spec.name for spec in specs]
            for spec in specs:  # the names and one-line descriptions are there, the schemas are not
                assert f"- {spec.name}: {one_line(spec.description)}" in offer.specs[LOADER].description
            # 30 tools of about 300 tokens each, in a context of 4,096: lazy at 25 %, not at 100 %.
            assert prompts[None] == prompts[1.0] > 4096 * 0.25 + prompts[0.25]
            assert (
                said.count(
                    f"the 30 tools' schemas would take more than 25% of the context: the model gets their names and "
                    f"{LOADER} to load the ones it needs (lazy_tools in the config)"
                )
                == 1
            )
            # A load: the tool joins the offer, after the loader; the catalog keeps the rest.
            name = specs[3].name
            assert offer.load(name) == f"{name} is loaded: it is among your tools now, with its parameters; call it."
            assert list(offer.specs) == [LOADER, name] and name not in offer.catalog
            assert offer.take_loaded() and not offer.take_loaded()  # said once per load
            assert offer.load(name).startswith(f"{name} is already loaded")
    finally:
        session.close()


@pytest.mark.slow
def test_ask_loads_a_tool_and_the_prefix_breaks_only_after_a_load(cli, smollm2_path):
    run = cli(
        "ask",
        "-m",
        str(smollm2_path),
        "--ctx",
        "4096",
        "--temperature",
        "0",
        "--seed",
        "1",
        "--no-history",
        "--max-tokens",
        "100",
        "--mcp",
        spec_of(30),
        "--tool-choice",
        "required",
        "--chain-limit",
        "3",
        "--approve-tools",
        "--json",
        "Search the pages for the id 42.",
    )
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    assert "the 30 tools' schemas would take more than 25% of the context" in run.stderr
    record = json.loads(run.stdout)
    calls, rounds = record["tool_calls"], record["stats"]["rounds"]
    first = calls[0]  # the forced first round: the loader is the one tool it can call
    assert first["name"] == LOADER
    loaded = first["arguments"]["name"]
    assert loaded.startswith("python_") and first["result"].startswith(f"{loaded} is loaded")
    assert 0 < rounds[1]["cached_tokens"] < rounds[0]["prompt_tokens"], rounds  # the block grew after its end
    # Each load breaks the reuse of the last prompt once (the round after it prefills from the end
    # of the tool block); no other round does, whatever the model called.
    loads = [c for c in calls if c["name"] == LOADER and c.get("result", "").endswith("call it.")]
    breaks = [n for n in range(1, len(rounds)) if rounds[n]["cached_tokens"] < rounds[n - 1]["prompt_tokens"]]
    assert len(breaks) == len(loads), (rounds, calls)
    names = {c["arguments"]["name"] for c in loads}
    for call in calls[1:]:
        if call["name"] != LOADER:  # only a loaded tool can be called: the grammar holds the names
            assert call["name"] in names and call["result"].startswith(call["name"].removeprefix("python_"))


@pytest.mark.slow
def test_lazy_tools_1_in_the_config_offers_every_schema(cli, smollm2_path, isolated_home):
    isolated_home.mkdir(parents=True, exist_ok=True)
    (isolated_home / "config.toml").write_text("lazy_tools = 1\n")
    run = cli(
        "ask", "-m", str(smollm2_path), "--ctx", "4096", "--no-history", "--max-tokens", "1", "--mcp", spec_of(5),
        "--json", "Hi",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "schemas would take more than" not in run.stderr and json.loads(run.stdout)["tool_calls"] == []
    (isolated_home / "config.toml").write_text("lazy_tools = 2\n")
    bad = cli("ask", "-m", str(smollm2_path), "--no-history", "Hi")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().endswith("lazy_tools must be a number from 0 to 1 (0.25: 25 % of the context)")
