"""`llmchat template list | render | show | parse`: the built-in chat templates, and what a model gets.

Only typer and the environment are imported here; jinja2 (through llmchat.prompt), rich and the
GGUF reader are imported inside the commands so `llmchat --help` stays fast. (No `from __future__ import
annotations`: Typer reads the annotations at run time.)
"""

from typing import Any, Optional

import typer

from llmchat.env import current_environment

MODEL_HELP = "Model: a .gguf path, a name in the models folder, or a config alias."
TEMPLATE_HELP = "A built-in template name or a path to a .jinja file (overrides the model's own template)."
TOOLS_HELP = (
    "Render with these tools: a JSON list of tools (OpenAI-style or {name, description, parameters}), "
    "or a Python file whose public functions become tools (it is imported: use your own code)."
)

# The conversation `template show` renders: every role once, ending with a user turn.
SAMPLE_CONVERSATION = (
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello!"},
    {"role": "assistant", "content": "Hi! How can I help?"},
    {"role": "user", "content": "What is 2 + 2?"},
)


def list_templates() -> None:
    """The built-in templates: what they match in a model's metadata, and their stop strings."""
    from rich.table import Table

    from llmchat.prompt.builtins import builtin_templates
    from llmchat.ui.safe_console import safe_console

    table = Table(title="Built-in chat templates", title_justify="left", show_lines=True)
    table.add_column("name", style="bold", no_wrap=True)
    table.add_column("matches (architecture / name / tokens)", overflow="fold", ratio=3)
    table.add_column("stop strings", overflow="fold", ratio=2)
    table.add_column("source", overflow="fold", ratio=4)
    for template in builtin_templates():
        table.add_row(template.name, _match_summary(template), _quoted(template.stop_strings), template.source)
    # Piped output has no terminal width; a wide table keeps one template per few lines there.
    env = current_environment()
    width = None if env.stdout_isatty else 160
    safe_console(env.stdout, on_terminal=env.stdout_isatty, width=width).print(table)


def _match_summary(template: Any) -> str:
    lines = []
    if template.match_architectures:
        lines.append("arch: " + ", ".join(template.match_architectures))
    if template.match_names:
        lines.append("name: " + ", ".join(template.match_names))
    if template.match_tokens:
        lines.append("tokens: " + " ".join(template.match_tokens))
    return "\n".join(lines) or "-"


def _quoted(strings: Any) -> str:
    return " ".join(repr(s) for s in strings) or "-"


def render(
    messages_file: str = typer.Option(
        ..., "--messages", help='JSON file with a list of {"role": ..., "content": ...} objects ("-" reads stdin).'
    ),
    model: Optional[str] = typer.Option(None, "-m", "--model", help=MODEL_HELP),
    template: Optional[str] = typer.Option(None, "--template", help=TEMPLATE_HELP),
    bos_token: Optional[str] = typer.Option(
        None, "--bos-token", help="BOS text for the template (default: the model's, or empty)."
    ),
    eos_token: Optional[str] = typer.Option(
        None, "--eos-token", help="EOS text for the template (default: the model's, or empty)."
    ),
    no_generation_prompt: bool = typer.Option(
        False, "--no-generation-prompt", help="Leave out the opening of the assistant's reply."
    ),
    tools_file: Optional[str] = typer.Option(None, "--tools", help=TOOLS_HELP),
) -> None:
    """Print the exact prompt a template makes of a conversation (nothing else, no newline added).
    With --tools the messages may hold assistant tool_calls and tool results."""
    from dataclasses import replace

    from llmchat.prompt.model_facts import ModelFacts
    from llmchat.prompt.render import render_prompt
    from llmchat.prompt.resolution import resolve_template

    messages = read_messages(messages_file)
    facts, config_choice = model_facts(model) if model else (ModelFacts(), None)
    if bos_token is not None:
        facts = replace(facts, bos_token=bos_token)
    if eos_token is not None:
        facts = replace(facts, eos_token=eos_token)
    resolved = resolve_template(facts, template, config_choice)
    env = current_environment()
    if resolved.warning:
        env.write_err(f"llmchat: warning: {resolved.warning}\n")
    if tools_file is not None:
        text = render_with_tools(resolved, messages, facts, tools_file, not no_generation_prompt)
    else:
        text = render_prompt(resolved, messages, facts, add_generation_prompt=not no_generation_prompt).text
    env.write_out(text)  # the template's and the messages' text: terminal-safe on a terminal, piped exact


def render_with_tools(resolved: Any, messages: list, facts: Any, tools_file: str, generation_prompt: bool) -> str:
    """The prompt with a tool list, in the model's own tool format (llmchat.tools.prompt); the
    format goes to stderr, once."""
    from llmchat.prompt.render import fold_system_messages
    from llmchat.tools import generic
    from llmchat.tools.families import GENERIC, detect_family
    from llmchat.tools.prompt import render_tool_prompt
    from llmchat.tools.tools_file import read_tools_file

    specs = read_tools_file(tools_file)
    family = detect_family(resolved.text)
    if resolved.system_mode == "folded":
        messages = fold_system_messages(messages)
    note = generic.NOTICE if family is GENERIC else f"tool call format: {family.label}"
    current_environment().write_err(f"llmchat: {note}\n")
    return render_tool_prompt(
        resolved.text,
        messages,
        specs,
        family=family,
        bos_token=facts.bos_token,
        eos_token=facts.eos_token,
        add_generation_prompt=generation_prompt,
        label=resolved.source_detail,
    )


def show(
    model: Optional[str] = typer.Option(None, "-m", "--model", help=MODEL_HELP + " Default: the default model."),
    template: Optional[str] = typer.Option(None, "--template", help=TEMPLATE_HELP),
    tools_file: Optional[str] = typer.Option(None, "--tools", help=TOOLS_HELP),
) -> None:
    """Which template a model gets and why: source, stop strings, system-prompt handling, tool call
    format, a sample (with --tools: the sample prompt with those tools)."""
    from llmchat.prompt.render import render_prompt
    from llmchat.prompt.resolution import resolve_template
    from llmchat.tools.families import detect_family

    facts, config_choice = model_facts(model)
    resolved = resolve_template(facts, template, config_choice)
    sample = render_prompt(resolved, SAMPLE_CONVERSATION, facts)
    lines = describe(resolved, facts, sample)
    family = detect_family(resolved.text)
    triggers = f" (a call opens with {_quoted(family.triggers)})" if family.triggers else ""
    lines[5:5] = [f"tool calls:    {family.label}{triggers}", *format_lines(resolved.text, family)]
    if tools_file is not None:
        text = render_with_tools(resolved, list(SAMPLE_CONVERSATION[:2]), facts, tools_file, True)
        lines.extend(["sample with tools (system, user; with the generation prompt):", "-" * 72, text, "-" * 72])
    for line in lines:  # the template's name, markers and sample: terminal-safe on a terminal
        current_environment().write_out(line + "\n")


def format_lines(source: str, family: Any) -> list[str]:
    """What the analysis of the template found (llmchat.prompt.format_analysis), as show prints it."""
    from llmchat.prompt.format_analysis import analyze
    from llmchat.prompt.layout import INDEX_SLOT
    from llmchat.reasoning.formats import detect_format

    def shown(text: str) -> str:
        return repr(text.replace(INDEX_SLOT, "{index}").replace("\ue000id\ue000", "{id}"))

    found = analyze(source)
    lines = []
    layout = family.layout
    if layout is not None:
        lines.append("  format:      derived from the template")
        markers = [
            (label, getattr(layout, name))
            for label, name in (
                ("section", "section_start"),
                ("call", "call_start"),
                ("arguments", "args_start"),
                ("call end", "call_end"),
                ("between", "separator"),
                ("section end", "section_end"),
            )
            if getattr(layout, name)
        ]
        lines.append("  markers:     " + ", ".join(f"{label} {shown(text)}" for label, text in markers))
        arguments = layout.describe()
        if layout.args == "tagged" and not layout.name_in_json:
            arguments += (
                f": key {shown(layout.key_prefix)}, string {shown(layout.string_prefix)}…{shown(layout.string_suffix)}, "
                f"other {shown(layout.value_prefix)}…{shown(layout.value_suffix)}, between {shown(layout.arg_separator)}"
            )
        lines.append(f"  arguments:   {arguments}")
    elif family.id != "generic":
        lines.append("  format:      a hand-written row (the analysis cannot see this format in the template)")
    if found.missing:
        lines.append(f"  analysis:    {'; '.join(found.missing)}")
    reasoning = detect_format(source)
    if reasoning is None:
        lines.append("reasoning:     none")
    else:
        derived = found.reasoning is not None and found.reasoning.start == reasoning.open_tag
        opens = " (the generation prompt opens it)" if found.reasoning and found.reasoning.opens_in_prompt else ""
        how = "derived from the template" if derived else "from the template's text"
        lines.append(f"reasoning:     {reasoning.name}{opens}, {how}")
    lines.append(f"switches:      {', '.join(found.switches) or 'none'}")
    return lines


def parse(
    output_file: str = typer.Argument("-", help='A file holding a model\'s raw output ("-" or nothing: stdin).'),
    model: Optional[str] = typer.Option(None, "-m", "--model", help=MODEL_HELP + " Default: the default model."),
    template: Optional[str] = typer.Option(None, "--template", help=TEMPLATE_HELP),
    tools_file: Optional[str] = typer.Option(
        None, "--tools", help="The tools offered (as for render): their schemas type the arguments."
    ),
    no_think: bool = typer.Option(False, "--no-think", help="Read the output as written with thinking switched off."),
) -> None:
    """How llmchat reads a model's raw output with this template: the content, the reasoning and
    the tool calls, as one JSON object on stdout. No model is loaded."""
    import json

    from llmchat.prompt.model_facts import ModelFacts
    from llmchat.prompt.resolution import resolve_template
    from llmchat.turn.reading import read_output

    raw = read_text_input(output_file, "the model output")
    facts, config_choice = model_facts(model) if model or not template else (ModelFacts(), None)
    resolved = resolve_template(facts, template, config_choice)
    schemas = {}
    if tools_file is not None:
        from llmchat.tools.tools_file import read_tools_file

        schemas = {spec.name: spec.parameters for spec in read_tools_file(tools_file)}
    reading = read_output(resolved.text, raw, schemas, thinking=not no_think)
    current_environment().stdout.write(json.dumps(reading, ensure_ascii=False, indent=2) + "\n")


def read_text_input(source: str, what: str) -> str:
    """A file's text, or stdin's for "-"; anything that is not UTF-8 text is a one-line UsageError."""
    from pathlib import Path

    from llmchat.edges.bounded_input import ANY_TEXT, read_file, read_stream
    from llmchat.errors import UsageError

    try:
        data = (
            read_stream(current_environment().stdin.buffer, "stdin", ANY_TEXT)
            if source == "-"
            else read_file(Path(source).expanduser(), f"{what} ({source})", ANY_TEXT)
        )
    except OSError as err:
        raise UsageError(f"{what} ({source}): cannot read it ({err.strerror or err})") from None
    if b"\x00" in data:
        raise UsageError(f"{what} ({source}): not text (it holds NUL bytes); give the text the model wrote")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{what} ({source}): not UTF-8 text; give the text the model wrote") from None


def describe(resolved: Any, facts: Any, sample: Any) -> list[str]:
    model = ", ".join(
        f"{label} {value}"
        for label, value in (("architecture", facts.architecture), ("name", facts.name), ("basename", facts.basename))
        if value
    )
    system = (
        "native (the template renders system messages itself)"
        if resolved.system_mode == "native"
        else 'folded (the system prompt is put in front of the first user message: system + "\\n" + user)'
    )
    lines = [
        f"model:         {model or '?'}",
        f"template:      {resolved.name}",
        f"source:        {resolved.source} - {resolved.source_detail}",
        f"stop strings:  {_quoted(resolved.stop_strings)}",
        f"system prompt: {system}",
    ]
    if resolved.warning:
        lines.append(f"warning:       {resolved.warning}")
    lines.append("resolution:")
    lines.extend(f"  {step}" for step in resolved.steps)
    notes = [*resolved.notes, *sample.notes]
    if notes:
        lines.append("notes:")
        lines.extend(f"  - {note}" for note in notes)
    lines.append("sample (system, user, assistant, user; with the generation prompt):")
    lines.append("-" * 72)
    lines.append(sample.text)
    lines.append("-" * 72)
    return lines


# --- shared helpers ------------------------------------------------------------------------------
def read_messages(source: str) -> list:
    """The --messages JSON: a list of {role, content} objects. Any problem is a one-line UsageError."""
    import json
    from pathlib import Path

    from llmchat.edges.bounded_input import ANY_TEXT, read_file, read_stream
    from llmchat.errors import UsageError

    try:
        raw = (
            read_stream(current_environment().stdin.buffer, "stdin", ANY_TEXT)
            if source == "-"
            else read_file(Path(source).expanduser(), f"--messages {source}", ANY_TEXT)
        ).decode("utf-8")
    except OSError as err:
        raise UsageError(f"--messages {source}: cannot read it ({err.strerror or err})") from None
    except UnicodeDecodeError:
        raise UsageError(f"--messages {source}: not UTF-8 text") from None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as err:
        raise UsageError(
            f"--messages {source}: not valid JSON ({err.msg} at line {err.lineno}, column {err.colno})"
        ) from None
    if isinstance(data, dict) and isinstance(data.get("messages"), list):
        data = data["messages"]  # also accept the {"messages": [...]} request shape
    if not isinstance(data, list) or not data:
        raise UsageError(
            f'--messages {source}: expected a non-empty JSON list of {{"role": ..., "content": ...}} objects'
        )
    return data


def model_facts(model: Optional[str]) -> tuple:
    """(ModelFacts of the -m model, the config file's template for it or None): -m resolved by the
    one resolver chat uses, the facts built by the one builder chat uses."""
    from llmchat.env import current_environment
    from llmchat.models.resolve import resolve_model
    from llmchat.prompt.model_facts import facts_from_gguf

    resolved = resolve_model(model, current_environment().config)
    return facts_from_gguf(resolved.path), resolved.template
