"""Saved prompts: [prompts.NAME] in the config, -p NAME on ask/chat/batch, /prompt NAME, `llmchat prompts`."""

from __future__ import annotations

import io
import json

import pytest

from llmchat.config import load_config
from llmchat.engine.sampling import PRESETS, build_sampling
from llmchat.errors import ConfigError, UsageError
from llmchat.options import RunOptions
from llmchat.startup.saved_prompts import apply_to_options, lookup, sampling_layers

PIRATE = """
[prompts.pirate]
system = "You are a pirate. Answer in one short sentence."
preset = "precise"
max_tokens = 12
description = "answers like a pirate"

[prompts.plain]
system = "Be plain."
"""


def _write_config(home, text=PIRATE):
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(text)
    return load_config(home / "config.toml")


def test_flags_beat_the_saved_prompt_which_beats_the_config(isolated_home):
    config = _write_config(isolated_home)
    layers = sampling_layers("pirate", config)
    params = build_sampling(config_values={"temperature": 0.9}, prompt_layers=layers)
    assert params.preset == "precise"
    assert (params.temperature, params.source_of("temperature")) == (
        PRESETS["precise"]["temperature"],
        "prompt pirate preset precise",
    )
    assert (params.max_tokens, params.source_of("max_tokens")) == (12, "prompt pirate")
    params = build_sampling(prompt_layers=layers, flags={"temperature": 0.5}, flag_preset="creative")
    assert (params.temperature, params.source_of("temperature")) == (0.5, "flag")
    assert params.preset == "creative" and params.source_of("top_k") == "preset creative"


def test_options_take_the_prompt_where_no_flag_was_given(isolated_home):
    config = _write_config(isolated_home)
    opts = apply_to_options(RunOptions(saved_prompt="pirate"), config)
    assert opts.system == "You are a pirate. Answer in one short sentence."
    assert dict(opts.origins) == {"system": "prompt pirate"}
    opts = apply_to_options(RunOptions(saved_prompt="pirate", system="Mine."), config)
    assert opts.system == "Mine." and opts.origins == ()


def test_a_missing_name_lists_the_known_ones(isolated_home):
    config = _write_config(isolated_home)
    with pytest.raises(UsageError, match=r"no saved prompt named 'nope' \(known: pirate, plain\)"):
        lookup("nope", config)


@pytest.mark.parametrize(
    "text, words",
    [
        ("[prompts.x]\nsystem = 3\n", "prompts.x.system must be a string"),
        ("[prompts.x]\ncolour = 'a'\n", "unknown key 'colour'"),
        ("[prompts.x]\npreset = 'wild'\n", "prompts.x.preset must be one of"),
        ("[prompts.x]\ntemperature = -1\n", "temperature must be 0 or more"),
        ("prompts = 3\n", "prompts must be a table"),
    ],
)
def test_bad_saved_prompts_are_config_errors(isolated_home, text, words):
    with pytest.raises(ConfigError, match=words):
        _write_config(isolated_home, text)


def test_prompts_list_and_show(cli, isolated_home):
    _write_config(isolated_home)
    listed = cli("prompts", "list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines() == [
        "pirate  answers like a pirate  [preset precise, max_tokens=12]",
        "plain   Be plain.",
    ]
    shown = cli("prompts", "show", "pirate", "--json")
    assert json.loads(shown.stdout)["system"].startswith("You are a pirate")
    missing = cli("prompts", "show", "nope")
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr.count("\n") == 1 and "known: pirate, plain" in missing.stderr


@pytest.mark.parametrize("command", [("ask", "hi"), ("chat",), ("batch", "-")])
def test_a_missing_prompt_exits_2_before_loading(cli, isolated_home, command):
    _write_config(isolated_home)
    result = cli(command[0], "-p", "nope", *command[1:], input="hi\n")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "no saved prompt named 'nope' (known: pirate, plain)" in result.stderr


def test_ask_p_applies_system_and_preset_and_a_flag_overrides_temperature(cli, isolated_home):
    _write_config(isolated_home)
    result = cli("ask", "-p", "pirate", "--temperature", "0.5", "--seed", "3", "--json", "Where is the treasure?")
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["saved"] and record["stats"]["generated_tokens"] <= 12  # the prompt's max_tokens
    shown = cli("history", "show", record["conversation_id"], "--json")
    stored = json.loads(shown.stdout)
    assert stored["system_prompt"] == "You are a pirate. Answer in one short sentence."
    sampling = stored["sampling"]
    assert sampling["preset"] == "precise" and sampling["top_k"] == PRESETS["precise"]["top_k"]
    assert sampling["temperature"] == 0.5  # the flag, over the preset's 0.2
    assert stored["messages"][1]["sampling"]["temperature"] == 0.5


def test_slash_prompt_and_show_provenance(isolated_home):
    """/prompt NAME in a chat started with -p another: /show names the prompt as each value's origin."""
    from rich.console import Console

    from llmchat.startup.loading import start_session
    from llmchat.ui import slash
    from llmchat.ui.context import CommandContext

    _write_config(isolated_home)
    config = load_config()
    opts = apply_to_options(RunOptions(saved_prompt="plain", temperature=0.0, max_tokens=8), config)
    session = start_session(opts, config=config, overflow="drop", with_history=False)
    try:
        out = io.StringIO()
        errors: list[str] = []
        said: list[str] = []
        ctx = CommandContext(session=session, out=Console(file=out, width=200), error=errors.append, info=said.append)
        slash.dispatch("/show", ctx)
        rows = {line.split()[0]: line for line in out.getvalue().splitlines() if line.strip()}
        assert "Be plain." in rows["system"] and rows["system"].rstrip().endswith("prompt plain")
        assert rows["temperature"].rstrip().endswith("flag")

        slash.dispatch("/prompt nope", ctx)
        assert errors and "known: pirate, plain" in errors[-1]
        slash.dispatch("/prompt pirate", ctx)
        assert session.conversation.system.startswith("You are a pirate")
        assert any("prompt pirate: system prompt set" in line for line in said)
        out.seek(0), out.truncate()
        slash.dispatch("/show", ctx)
        rows = {line.split()[0]: line for line in out.getvalue().splitlines() if line.strip()}
        assert rows["system"].rstrip().endswith("prompt pirate")
        assert rows["temperature"].rstrip().endswith("prompt pirate preset precise")
        assert rows["max_tokens"].rstrip().endswith("prompt pirate")
        assert session.turn("Where is the gold?").stats.generated_tokens <= 12
    finally:
        session.close()


def _prompt_lines(session, name: str) -> list[str]:
    from llmchat.ui.saved_prompt import apply_to_session

    return apply_to_session(session, name)


def test_slash_prompt_naming_another_model_says_the_model_command_that_loads_it(
    isolated_home, smollm2_path, gemma_path
):
    from llmchat.startup.loading import start_session

    _write_config(
        isolated_home,
        f'[prompts.same]\nsystem = "Be plain."\nmodel = "{smollm2_path}"\n\n'
        f'[prompts.other]\nsystem = "Be plain."\nmodel = "{gemma_path}"\n',
    )
    config = load_config()
    session = start_session(
        RunOptions(model=str(smollm2_path), max_tokens=8), config=config, overflow="drop", with_history=False
    )
    try:
        assert _prompt_lines(session, "same") == ["prompt same: system prompt set"]
        other = _prompt_lines(session, "other")
        assert other[-1] == (
            f"prompt other: prompt other names the model {gemma_path}; this chat is on {session.model_label}: "
            f"/model {gemma_path} switches to it"
        )
        assert session.engine.info.model_path == str(smollm2_path), "named, not loaded"
    finally:
        session.close()


def test_slash_prompt_on_a_server_knows_the_server_model_it_runs_on(isolated_home):
    """A saved prompt naming the configured server the chat runs on (`NAME`, or `NAME:MODEL`) names
    its model; another model on it is said, and that /model cannot switch a server."""
    from test_remote import StandIn, openai_models

    from llmchat.startup.loading import start_session

    server = StandIn()
    server.routes[("GET", "/v1/models")] = openai_models("tiny")
    try:
        _write_config(
            isolated_home,
            f'[servers.stand]\nurl = "{server.url}"\nkind = "openai"\nmodel = "tiny"\n\n'
            '[prompts.server]\nsystem = "Be plain."\nmodel = "stand"\n\n'
            '[prompts.served]\nsystem = "Be plain."\nmodel = "stand:tiny"\n\n'
            '[prompts.elsewhere]\nsystem = "Be plain."\nmodel = "stand:large"\n',
        )
        config = load_config()
        session = start_session(RunOptions(model="stand"), config=config, overflow="drop", with_history=False)
        try:
            assert session.model_label == "stand:tiny"
            assert _prompt_lines(session, "server") == ["prompt server: system prompt set"]
            assert _prompt_lines(session, "served") == ["prompt served: system prompt set"]
            assert _prompt_lines(session, "elsewhere")[-1] == (
                "prompt elsewhere: prompt elsewhere names the model stand:large; this chat runs on a server "
                "(stand:tiny), whose model /model cannot switch (start llmchat chat -p elsewhere to use it)"
            )
        finally:
            session.close()
    finally:
        server.close()
