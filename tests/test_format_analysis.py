"""The call and reasoning format derived from a template (llmchat.prompt.format_analysis): what it
finds in real upstream templates, a family nobody listed (a template with its markers renamed),
the writer and reader agreeing, the disk cache, and `template show` / `template parse`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmchat.prompt import format_analysis
from llmchat.prompt.format_analysis import analyze, analyze_uncached
from llmchat.prompt.format_parser import call_text, parse
from llmchat.tools.families import detect_family
from llmchat.turn.reading import read_output

TEMPLATES = Path(__file__).parent / "data" / "chat_cases" / "templates"

CALLS = [("get_weather", {"city": "Paris", "days": 3}), ("my-server_read.file", {"path": "a <b> c", "lines": [1, 2]})]
SCHEMAS = {
    "get_weather": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}},
    "my-server_read.file": {"type": "object", "properties": {"path": {"type": "string"}, "lines": {"type": "array"}}},
}


def source(name: str) -> str:
    return (TEMPLATES / name).read_text(encoding="utf-8")


def derived_templates() -> list[str]:
    """The templates whose calls are read by a layout (derived, or a row of layout data)."""
    return sorted(p.name for p in TEMPLATES.glob("*.jinja") if detect_family(p.read_text(encoding="utf-8")).derived)


@pytest.mark.parametrize(
    ("name", "opener"),
    [
        ("google-gemma-4-31B-it.jinja", "<|tool_call>call:"),
        ("MiniMax-M2.jinja", '<minimax:tool_call>\n<invoke name="'),
        ("Kimi-K2-Instruct.jinja", "<|tool_calls_section_begin|><|tool_call_begin|>functions."),
        ("ByteDance-Seed-OSS.jinja", "<seed:tool_call>\n<function="),
        ("Apertus-8B-Instruct.jinja", "<|tools_prefix|>["),
        ("LFM2.5-8B-A1B.jinja", "<|tool_call_start|>["),
        ("GLM-4.7-Flash.jinja", "<tool_call>"),
        ("deepseek-ai-DeepSeek-V3.1.jinja", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"),
        ("Mistral-Small-3.2-24B-Instruct-2506.jinja", "[TOOL_CALLS]"),
    ],
)
def test_the_families_of_2026_are_derived_from_their_templates(name, opener):
    family = detect_family(source(name))
    assert family.derived, family.label
    assert family.triggers == (opener,)


@pytest.mark.parametrize(
    ("name", "start", "end", "opens"),
    [
        ("google-gemma-4-31B-it.jinja", "<|channel>thought", "<channel|>", False),
        ("ByteDance-Seed-OSS.jinja", "<seed:think>", "</seed:think>", False),
        ("GLM-4.7-Flash.jinja", "<think>", "</think>", True),
        ("MiniMax-M2.jinja", "<think>", "</think>", True),
    ],
)
def test_reasoning_markers_are_derived(name, start, end, opens):
    found = analyze_uncached(source(name)).reasoning
    assert found is not None
    assert (found.start, found.end, found.opens_in_prompt) == (start, end, opens)


def test_every_derived_layout_reads_back_what_it_writes():
    names = derived_templates()
    assert len(names) >= 30
    for name in names:
        layout = detect_family(source(name)).layout
        for calls in (CALLS[:1], CALLS):
            found = parse(layout, "Let me check. " + call_text(layout, calls), SCHEMAS)
            assert found.content.strip() == "Let me check.", name
            if len(calls) == 1 or layout.separator or layout.list_wrapped or layout.call_start.strip():
                assert [(c.name, c.arguments) for c in found.calls] == calls, name


# A family nobody has seen: GLM-4.7's template with every marker renamed.
RENAMES = {
    "<tool_call>": "<invoke_fn>",
    "</tool_call>": "</invoke_fn>",
    "<arg_key>": "<pk>",
    "</arg_key>": "</pk>",
    "<arg_value>": "<pv>",
    "</arg_value>": "</pv>",
    "<think>": "<ponder>",
    "</think>": "</ponder>",
}


def renamed_glm() -> str:
    text = source("GLM-4.7-Flash.jinja")
    for old, new in RENAMES.items():
        text = text.replace(old, new)
    return text


def test_a_template_never_seen_gets_its_parser_from_the_analysis():
    template = renamed_glm()
    family = detect_family(template)
    assert family.derived and family.triggers == ("<invoke_fn>",)
    output = "I should look it up.</ponder>Checking.<invoke_fn>get_weather<pk>city</pk><pv>Paris</pv><pk>days</pk><pv>3</pv></invoke_fn>"
    whole = read_output(template, output, SCHEMAS)
    streamed = read_output(template, list(output), SCHEMAS)
    expected = {
        "content": "Checking.",
        "reasoning_content": "I should look it up.",
        "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}],
    }
    assert whole == expected
    assert streamed == expected


def test_with_thinking_off_the_renamed_template_reads_no_reasoning():
    output = "Checking.<invoke_fn>get_weather<pk>city</pk><pv>Oslo</pv></invoke_fn>"
    reading = read_output(renamed_glm(), output, SCHEMAS, thinking=False)
    assert reading["reasoning_content"] == ""
    assert reading["tool_calls"] == [{"name": "get_weather", "arguments": {"city": "Oslo"}}]


def test_the_analysis_is_cached_on_disk_by_template_text(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMCHAT_HOME", str(tmp_path))
    template = renamed_glm() + "{# a variant #}"
    analyze.cache_clear()
    first = analyze(template)
    entries = list((tmp_path / "cache" / "formats").glob("*.json"))
    assert len(entries) == 1
    analyze.cache_clear()
    calls = []
    monkeypatch.setattr(format_analysis, "analyze_uncached", lambda text: calls.append(text))
    assert analyze(template) == first  # read back, not analysed again
    assert calls == []
    entries[0].write_text("{not json")
    analyze.cache_clear()
    monkeypatch.undo()
    monkeypatch.setenv("LLMCHAT_HOME", str(tmp_path))
    assert analyze(template) == first  # a damaged entry is analysed again
    analyze.cache_clear()


def test_a_result_a_limit_cut_short_is_not_kept_on_disk(tmp_path, monkeypatch):
    """A render that ran past the sandbox's limits (on a busy machine the time limit trips where it
    would not on the next load) loses that load its facts, not every later one: nothing is kept,
    and the next analysis finds the calls."""
    from llmchat.prompt import sandbox_limits

    monkeypatch.setenv("LLMCHAT_HOME", str(tmp_path))
    template = renamed_glm() + "{# cut short #}"
    analyze.cache_clear()
    with monkeypatch.context() as tight:
        tight.setattr(sandbox_limits, "RENDER_STEP_LIMIT", 40)  # every render of this template runs past it
        cut = analyze(template)
    assert cut.calls is None and "the template's renders hit the sandbox's limits" in cut.missing
    assert list((tmp_path / "cache" / "formats").glob("*.json")) == []
    analyze.cache_clear()
    whole = analyze(template)
    assert whole.calls is not None and whole == analyze_uncached(template)
    assert len(list((tmp_path / "cache" / "formats").glob("*.json"))) == 1
    analyze.cache_clear()


ANALYSE_ONCE = "import sys\nfrom llmchat.prompt.format_analysis import analyze\nanalyze(open(sys.argv[1]).read())\n"


def test_the_disk_cache_is_keyed_by_the_version_of_jinja2(tmp_path):
    """Two real runs on one template: the second with another jinja2 version (its `__version__`
    changed at start-up by a sitecustomize) analyses again under a key of its own."""
    import os
    import subprocess
    import sys

    from shims import sitecustomize_env

    template = tmp_path / "template.jinja"
    template.write_text(renamed_glm() + "{# versions #}", encoding="utf-8")
    home = dict(os.environ, LLMCHAT_HOME=str(tmp_path / "home"))
    entries = tmp_path / "home" / "cache" / "formats"
    for env in (
        home,
        sitecustomize_env(tmp_path / "shim", "import jinja2\njinja2.__version__ = '0.0.upgraded'\n", home),
    ):
        done = subprocess.run(
            [sys.executable, "-c", ANALYSE_ONCE, str(template)], env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
    assert len(list(entries.glob("*.json"))) == 2


def test_the_disk_cache_key_holds_the_code_of_every_module_the_analysis_runs():
    """KEY_SOURCES against the analysis's own imports: every llmchat module that format_analysis
    imports, directly or through another (the sandbox, its limits), and no other. The cache's own
    module is not followed: it decides where a result is kept, not what it is."""
    import ast

    from llmchat.prompt.format_cache import KEY_SOURCES

    package = Path(format_analysis.__file__).parent.parent
    seen: set[str] = set()
    todo = ["llmchat.prompt.format_analysis"]
    while todo:
        module = todo.pop()
        relative = module.removeprefix("llmchat.").replace(".", "/") + ".py"
        if relative in seen or module == "llmchat.prompt.format_cache":
            continue
        seen.add(relative)
        for node in ast.walk(ast.parse((package / relative).read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("llmchat."):
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
                todo += [
                    name
                    for name in names
                    if (package / (name.removeprefix("llmchat.").replace(".", "/") + ".py")).exists()
                ]
            elif isinstance(node, ast.Import):
                todo += [alias.name for alias in node.names if alias.name.startswith("llmchat.")]
    assert sorted(seen) == sorted(KEY_SOURCES)


def test_a_template_without_calls_says_what_was_missing():
    found = analyze_uncached("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert found.calls is None
    assert found.missing == ("the template writes no tool call",)


def test_template_parse_prints_the_reading_as_json(cli, tmp_path):
    template = tmp_path / "renamed.jinja"
    template.write_text(renamed_glm())
    output = tmp_path / "out.txt"
    output.write_text("Hmm.</ponder>On it.<invoke_fn>get_weather<pk>city</pk><pv>Rome</pv></invoke_fn>")
    result = cli("template", "parse", "--template", str(template), str(output))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "content": "On it.",
        "reasoning_content": "Hmm.",
        "tool_calls": [{"name": "get_weather", "arguments": {"city": "Rome"}}],
    }


def test_template_parse_refuses_what_is_not_text(cli, tmp_path):
    template = tmp_path / "renamed.jinja"
    template.write_text(renamed_glm())
    binary = tmp_path / "out.bin"
    binary.write_bytes(b"\x00\x01\xff\xfe")
    result = cli("template", "parse", "--template", str(template), str(binary))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "not text" in lines[0]


def test_template_show_prints_what_was_derived(cli, tmp_path):
    template = tmp_path / "renamed.jinja"
    template.write_text(renamed_glm())
    result = cli("template", "show", "--template", str(template))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "derived from the template" in out
    assert "'<invoke_fn>'" in out and "tagged arguments" in out
    assert "<ponder>…</ponder> (the generation prompt opens it), derived from the template" in out
    assert "switches:      enable_thinking" in out
