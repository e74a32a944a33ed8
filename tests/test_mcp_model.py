"""A forced call to server-everything through the real model (SmolLM2, `--tool-choice NAME`; the
grammar gate makes the call parse), once over each transport: the result the tool loop hands back
is the handled one (text, or an image's placeholder naming the saved file)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

FORCED = ("--temperature", "0", "--seed", "1", "--no-history", "--max-tokens", "48", "--chain-limit", "1")


def forced_call(cli, smollm2_path, spec: str, tool: str, prompt: str):
    run = cli(
        "ask",
        "-m",
        str(smollm2_path),
        *FORCED,
        "--mcp",
        spec,
        "--tool-choice",
        tool,
        "--approve-tools",
        "--json",
        prompt,
    )
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    record = json.loads(run.stdout)
    [call] = record["tool_calls"]
    assert call["name"] == tool and call["approved"] is True
    assert len(record["stats"]["rounds"]) == 2  # the call's round, then the answer over its result
    return run, call


def test_a_forced_echo_over_stdio(cli, smollm2_path, npm_mcp_bin):
    run, call = forced_call(
        cli, smollm2_path, str(npm_mcp_bin / "mcp-server-everything"), "everything_echo", "Echo hello."
    )
    assert isinstance(call["arguments"]["message"], str)
    assert call["result"] == f"Echo: {call['arguments']['message']}"
    assert "tool call: everything_echo(" in run.stderr


def test_a_forced_image_over_streamable_http(cli, smollm2_path, everything_http_url, isolated_home):
    run, call = forced_call(
        cli, smollm2_path, f"everything={everything_http_url}", "everything_get-tiny-image", "Show me the tiny image."
    )
    assert call["arguments"] == {}
    # The server's text parts stay around the image's placeholder, in the server's order.
    placeholder = re.search(r"\[image image/png, \d+ bytes, saved to ([^\]]+)\]", call["result"])
    assert placeholder is not None, call["result"]
    assert "everything_get-tiny-image returned image image/png: saved to " in run.stderr
    # --no-history: the image was kept in the run's temporary folder, gone with the run.
    saved = Path(placeholder.group(1))
    assert isolated_home not in saved.parents and not saved.exists()
