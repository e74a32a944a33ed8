"""The built-in chat templates: one `<name>.jinja` per family, with the header that says which
models each one fits and where its turns stop.

They live in the top-level `templates/` folder (package data `llmchat.templates`), each opening
with a header comment:

    {#
    description: one line for `llmchat template list`
    match-architecture: gemma, gemma2, gemma3      general.architecture, exact (case-insensitive)
    match-name: gemma                               substring of general.name / general.basename,
                                                    lowercased with spaces and "_" turned into "-"
    match-token: <start_of_turn>, <end_of_turn>     vocabulary entries; when the vocabulary is
                                                    known, all must be present
    stop: <end_of_turn>, <eos>                      stop strings for generation
    source: where the format comes from (official template / documentation URL)
    #}

List values are separated by commas; inside a value `\\,` is a comma, `\\n` a newline, `\\t` a
tab and `\\\\` a backslash. Keys may repeat (values add up). The file name is the template name.
A user's own .jinja file may carry the same header; its `stop:` line is then used.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from llmchat.errors import TemplateError

# Strings that end a turn in some family; a GGUF template that mentions one gets it as a stop string.
KNOWN_STOP_MARKERS = (
    "<|im_end|>",
    "<end_of_turn>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "</s>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<|END_OF_TURN_TOKEN|>",
    "<|EOT|>",
    "<｜end▁of▁sentence｜>",
    "<|eot|>",
    "<|return|>",
    "<|end_of_turn|>",  # OpenChat
    "<|turn_end|>",
    "[|endofturn|]",
)


@dataclass(frozen=True)
class BuiltinTemplate:
    name: str
    path: str  # where the .jinja file was read from (for display)
    text: str
    description: str
    match_architectures: tuple[str, ...]
    match_names: tuple[str, ...]
    match_tokens: tuple[str, ...]
    stop_strings: tuple[str, ...]
    source: str


_HEADER_RE = re.compile(r"\A\s*\{#(.*?)#\}", re.S)
_LIST_KEYS = {"match-architecture", "match-name", "match-token", "stop"}
_TEXT_KEYS = {"description", "source"}


def parse_template_header(text: str, where: str) -> dict[str, list[str]]:
    """The `key: value` lines of a template's opening `{# ... #}` comment ({} when there is none)."""
    match = _HEADER_RE.match(text)
    if match is None:
        return {}
    header: dict[str, list[str]] = {}
    for number, raw in enumerate(match.group(1).splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        key, sep, value = line.partition(":")
        key = key.strip().lower()
        if not sep or key not in _LIST_KEYS | _TEXT_KEYS:
            known = ", ".join(sorted(_LIST_KEYS | _TEXT_KEYS))
            raise TemplateError(f"{where}: header line {number} {line!r} is not 'key: value' with a key from: {known}")
        values = _split_header_list(value) if key in _LIST_KEYS else [value.strip()]
        header.setdefault(key, []).extend(v for v in values if v)
    return header


def _split_header_list(value: str) -> list[str]:
    """Comma-separated values; backslash escapes \\, \\n \\t \\\\. Only unescaped whitespace
    around a value is dropped, so `\\n\\nUser:` keeps its newlines."""
    escapes = {",": ",", "n": "\n", "t": "\t", "\\": "\\"}
    items: list[str] = []
    current: list[tuple[str, bool]] = []  # (text, came from an escape)

    def finish() -> None:
        while current and not current[0][1] and current[0][0].isspace():
            current.pop(0)
        while current and not current[-1][1] and current[-1][0].isspace():
            current.pop()
        items.append("".join(text for text, _ in current))
        current.clear()

    chars = iter(value)
    for char in chars:
        if char == "\\":
            nxt = next(chars, "")
            current.append((escapes.get(nxt, "\\" + nxt), True))
        elif char == ",":
            finish()
        else:
            current.append((char, False))
    finish()
    return items


def _builtin_from_text(name: str, path: str, text: str) -> BuiltinTemplate:
    header = parse_template_header(text, f"built-in template {path}")
    return BuiltinTemplate(
        name=name,
        path=path,
        text=text,
        description=" ".join(header.get("description", [])),
        match_architectures=tuple(a.lower() for a in header.get("match-architecture", [])),
        match_names=tuple(normalize_model_name(n) for n in header.get("match-name", [])),
        match_tokens=tuple(header.get("match-token", [])),
        stop_strings=tuple(header.get("stop", [])),
        source="; ".join(header.get("source", [])),
    )


def _template_files() -> list[tuple[str, str, str]]:
    """(name, path for display, text) of every built-in, from the installed package data's
    folder or, in a source checkout that is not installed, from the repository's templates/
    folder. The folder is found from the package's import spec, not through importlib.resources,
    which imports zipfile and its readers: 0.4 MiB of a one-shot `ask`'s peak memory
    (bench/oneshot_vs_completion.py), for package data that pip always installs as files."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("llmchat.templates")
    except (ImportError, ValueError):
        spec = None
    folders = [Path(location) for location in (spec.submodule_search_locations or ())] if spec else []
    folders.append(Path(__file__).resolve().parents[2] / "templates")
    for folder in folders:
        try:
            found = [(p.stem, str(p), p.read_text(encoding="utf-8")) for p in folder.glob("*.jinja")]
        except OSError:
            continue
        if found:
            return found
    return []


@functools.lru_cache(maxsize=1)
def _builtins() -> tuple[BuiltinTemplate, ...]:
    templates = [_builtin_from_text(name, path, text) for name, path, text in _template_files()]
    if not templates:
        raise TemplateError(
            "no built-in chat templates found (the llmchat installation is incomplete); reinstall llmchat"
        )
    return tuple(sorted(templates, key=lambda t: t.name))


def builtin_templates() -> list[BuiltinTemplate]:
    return list(_builtins())


def builtin_template(name: str) -> BuiltinTemplate | None:
    return next((t for t in _builtins() if t.name == name), None)


def marker_tokens() -> tuple[str, ...]:
    """Every vocabulary entry the built-ins' match rules and the stop inference look at."""
    markers = {token for t in _builtins() for token in t.match_tokens}
    markers.update(KNOWN_STOP_MARKERS)
    return tuple(sorted(markers))


def normalize_model_name(text: str) -> str:
    """A model or template name as matching compares it: lowercase, spaces and "_" as "-"."""
    return re.sub(r"[\s_]+", "-", text.strip().lower())


def infer_stop_strings(text: str, eos_token: str = "") -> tuple[str, ...]:
    """Stop strings for a template without a header: the known end-of-turn markers it mentions,
    plus the model's EOS text when the template writes `eos_token`."""
    stops = [marker for marker in KNOWN_STOP_MARKERS if marker in text]
    if eos_token and "eos_token" in text and eos_token not in stops:
        stops.append(eos_token)
    return tuple(stops)
