"""`llmchat template render --tools FILE` and `template show --tools FILE`: the rendered tool prompt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmchat.errors import ExitCode

TEMPLATES = Path(__file__).parent / "data" / "templates"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
CALL_ROUND = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call00000", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
        ],
    },
    {"role": "tool", "tool_call_id": "call00000", "name": "get_weather", "content": "sunny"},
]


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    from llmchat.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(args)
    out, err = capsys.readouterr()
    return int(exit_info.value.code or 0), out, err


@pytest.fixture
def files(tmp_path):
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS), encoding="utf-8")
    messages = tmp_path / "messages.json"
    messages.write_text(json.dumps(CALL_ROUND), encoding="utf-8")
    return str(tools), str(messages)


def test_render_with_tools_writes_calls_and_results_the_models_way(files, capsys):
    tools, messages = files
    template = str(TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja")
    code, out, err = run_cli(
        ["template", "render", "--template", template, "--messages", messages, "--tools", tools], capsys
    )
    assert code == 0, err
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in out
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        in out
    )
    assert "<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n" in out
    assert out.endswith("<|im_start|>assistant\n")
    assert err == 'llmchat: tool call format: derived from the template: JSON object ("name")\n'


def test_firefunction_v2_renders_with_and_without_tools(files, tmp_path, capsys):
    tools, messages = files
    template = str(TEMPLATES / "fireworks-ai-llama-3-firefunction-v2.jinja")
    code, out, err = run_cli(
        ["template", "render", "--template", template, "--messages", messages, "--tools", tools], capsys
    )
    assert code == 0, err
    assert 'Available functions as JSON spec:\n[\n    {\n        "name": "get_weather"' in out
    assert ' functools[{"name": "get_weather", "arguments": {"city": "Paris"}}]<|eot_id|>' in out
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps([{"role": "user", "content": "Hello"}]), encoding="utf-8")
    code, out, err = run_cli(["template", "render", "--template", template, "--messages", str(plain)], capsys)
    assert code == 0, err
    assert "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>" in out


def test_render_with_a_functions_file(tmp_path, capsys):
    functions = tmp_path / "f.py"
    functions.write_text('def ping(host: str) -> str:\n    """Ping a host."""\n    return host\n', encoding="utf-8")
    messages = tmp_path / "m.json"
    messages.write_text(json.dumps([{"role": "user", "content": "hi"}]), encoding="utf-8")
    template = str(TEMPLATES / "meta-llama-Llama-3.1-8B-Instruct.jinja")
    code, out, err = run_cli(
        ["template", "render", "--template", template, "--messages", str(messages), "--tools", str(functions)], capsys
    )
    assert code == 0, err
    assert '"name": "ping"' in out and "Ping a host." in out
    assert "tool call format: Llama 3.x" in err


def test_a_template_without_tools_says_it_uses_the_generic_format(files, capsys):
    tools, messages = files
    code, out, err = run_cli(
        ["template", "render", "--template", "chatml", "--messages", messages, "--tools", tools], capsys
    )
    assert code == 0, err
    assert out.startswith("<|im_start|>system\nYou can call tools.")
    assert (
        '<|im_start|>assistant\n{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}<|im_end|>' in out
    )
    assert err.count("\n") == 1 and "generic format" in err


@pytest.mark.parametrize(
    "content, expected",
    [
        ("[", "not valid JSON"),
        ("[]", "expected a non-empty JSON list of tools"),
        ('[{"description": "x"}]', "tool 1 has no name"),
    ],
)
def test_a_bad_tools_file_is_one_usage_error(files, tmp_path, capsys, content, expected):
    _, messages = files
    bad = tmp_path / "bad.json"
    bad.write_text(content, encoding="utf-8")
    code, out, err = run_cli(
        ["template", "render", "--template", "chatml", "--messages", messages, "--tools", str(bad)], capsys
    )
    assert code == ExitCode.USAGE and out == ""
    assert err.count("\n") == 1 and expected in err


def test_show_names_the_tool_format_and_renders_the_tool_prompt(files, smollm2_path, capsys):
    tools, _ = files
    template = str(TEMPLATES / "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja")
    code, out, err = run_cli(
        ["template", "show", "-m", str(smollm2_path), "--template", template, "--tools", tools], capsys
    )
    assert code == 0, err
    # The format is read from the template itself (llmchat.prompt.format_analysis).
    assert "tool calls:    derived from the template: JSON object (\"name\") (a call opens with '<tool_call>')" in out
    assert "  markers:     call '<tool_call>\\n', call end '\\n</tool_call>'" in out
    assert "sample with tools" in out and "<tools>" in out and '"name": "get_weather"' in out
    code, out, _ = run_cli(["template", "show", "-m", str(smollm2_path)], capsys)
    assert "tool calls:    generic (JSON reply)" in out
