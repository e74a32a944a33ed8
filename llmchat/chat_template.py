"""Chat templates: choose one for a model, render conversations with it safely, and tell the
engine which parts of the prompt are template text and which are message text.

Resolution (`resolve_template`), first that applies wins:
    1. `--template NAME|PATH` (a built-in name, or a path to a .jinja file);
    2. the per-model template from the config file (same NAME|PATH forms);
    3. the model's own GGUF `tokenizer.chat_template` (named variants such as
       `tokenizer.chat_template.tool_use` are reported but not used);
    4. a built-in template matched on the GGUF metadata (marker tokens in the vocabulary first,
       then `general.name`/`general.basename`, then `general.architecture`);
    5. ChatML, with a warning that names the `--template` flag.

Rendering follows Hugging Face's conventions (jinja2 `ImmutableSandboxedEnvironment`,
trim_blocks, lstrip_blocks, loopcontrols, `raise_exception`, `strftime_now`, a `tojson` filter
with ensure_ascii=False) so GGUF templates written for `transformers` render the same here.
On top of the sandbox (which already refuses `__globals__`, `__subclasses__` and every other
underscore attribute) this module:
    * refuses `{% include %}`, `{% import %}`, `{% from %}` and `{% extends %}` (there is no loader);
    * drops the `cycler`, `joiner` and `lipsum` globals that templates never need;
    * counts every loop iteration and call and stops a render past RENDER_STEP_LIMIT steps or
      RENDER_TIME_LIMIT_S seconds, and checks string/list sizes before `*`, `+`, `~`, `%`,
      `join`, `replace`, `ljust`... build them, so neither `range(10**12)`, nested loops,
      recursive macros nor string doubling can hang or exhaust memory;
    * stops a render whose output passes MAX_PROMPT_CHARS.
Every failure becomes a `TemplateError` that names the template's source and the `--template`
override.

System prompts are never lost: each resolved template is probed once with a system message. If
it raises or drops the system text, `system_mode` is "folded" and `render_prompt` puts the
system text in front of the first user message (system + "\\n" + user, llama.cpp's convention).

`render_prompt` returns the prompt text and the same text as pieces `(text, trusted)`: message
contents are untrusted, so the engine can tokenize them without special-token parsing and a
user typing `<|im_end|>` gets plain text. The pieces come from a second render in which each
message content is replaced by a placeholder of private-use characters; the text around the
placeholders is the template's own (trusted). If that does not reproduce the real render exactly
(the template rewrites message text), the whole prompt becomes one trusted piece and a note says so.

Built-in templates live in the top-level `templates/` folder (package data `llmchat.templates`),
one `<name>.jinja` per family, each opening with a header comment:

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

import contextvars
import functools
import itertools
import json
import re
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from llmchat.errors import TemplateError, UsageError

# --- limits -------------------------------------------------------------------------------------
# Module attributes (not constants baked into functions) so tests can lower them.
RENDER_TIME_LIMIT_S = 2.0
RENDER_STEP_LIMIT = 2_000_000  # loop iterations + calls + operators, per render
MAX_PROMPT_CHARS = 8_000_000  # the rendered prompt
MAX_PRODUCED_CHARS = 32_000_000  # all text a render produces, including macros and {% set %} blocks
MAX_VALUE_CHARS = 8_000_000  # one string built by an expression
MAX_VALUE_ITEMS = 1_000_000  # one list built by an expression
MAX_INT_BITS = 65_536  # one integer built by * or **
MAX_TOJSON_INDENT = 64
MAX_TEMPLATE_CHARS = 1_000_000  # the template source; real chat templates are under 50 kB

OVERRIDE_HINT = "choose another with --template NAME|PATH (`llmchat template list` shows the built-ins)"

FALLBACK_TEMPLATE = "chatml"

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

_PROBE_SYSTEM = "llmchat-system-probe-7f3a"
_PROBE_USER = "llmchat-user-probe-91c2"

# Private-use characters (plane 15) mark where message contents go in the skeleton render.
_PLACEHOLDER_OPEN = "\U000f0000"
_PLACEHOLDER_CLOSE = "\U000f0001"
_PLACEHOLDER_RE = re.compile(f"{_PLACEHOLDER_OPEN}(\\d+){_PLACEHOLDER_CLOSE}")


# =================================================================================================
# Data types
# =================================================================================================
@dataclass(frozen=True)
class ModelFacts:
    """What template resolution needs to know about a model (from its GGUF metadata)."""

    architecture: str = ""
    name: str = ""
    basename: str = ""
    chat_template: str | None = None  # tokenizer.chat_template
    named_templates: Mapping[str, str] = field(default_factory=dict)  # tokenizer.chat_template.<name>
    bos_token: str = ""
    eos_token: str = ""
    tokens: frozenset[str] = frozenset()  # marker tokens present in the vocabulary
    # True when `tokens` was checked against the whole vocabulary for every built-in's markers
    # (facts_from_metadata does that): a built-in whose markers are missing is then ruled out.
    vocab_known: bool = False

    def has_token(self, text: str) -> bool:
        return text in self.tokens


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


@dataclass(frozen=True)
class Piece:
    text: str
    trusted: bool  # False: message content, to be tokenized without special-token parsing


@dataclass(frozen=True)
class RenderedPrompt:
    text: str
    pieces: tuple[Piece, ...]
    notes: tuple[str, ...] = ()


@dataclass
class ResolvedTemplate:
    name: str
    source: str  # "flag" | "config" | "gguf" | "builtin" | "fallback"
    source_detail: str  # e.g. "GGUF tokenizer.chat_template"; used in every error message
    text: str  # Jinja source
    stop_strings: tuple[str, ...]
    system_mode: str = "native"  # "native" | "folded"
    notes: list[str] = field(default_factory=list)  # for --verbose
    warning: str | None = None  # set for the ChatML fallback
    steps: list[str] = field(default_factory=list)  # how it was chosen
    _compiled: Any = field(default=None, repr=False, compare=False)

    def compiled(self) -> Any:
        """The compiled jinja2 Template, built once: rendering happens every turn."""
        if self._compiled is None:
            self._compiled = _compile(self.text, self.source_detail)
        return self._compiled


# =================================================================================================
# Built-in templates and their headers
# =================================================================================================
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
        match_names=tuple(_normalize_name(n) for n in header.get("match-name", [])),
        match_tokens=tuple(header.get("match-token", [])),
        stop_strings=tuple(header.get("stop", [])),
        source="; ".join(header.get("source", [])),
    )


def _template_files() -> list[tuple[str, str, str]]:
    """(name, path for display, text) of every built-in, from the installed package data or,
    in a source checkout that is not installed, from the repository's templates/ folder."""
    try:
        from importlib import resources

        root = resources.files("llmchat.templates")
        found = [
            (entry.name[: -len(".jinja")], str(entry), entry.read_text(encoding="utf-8"))
            for entry in root.iterdir()
            if entry.name.endswith(".jinja")
        ]
        if found:
            return found
    except (ImportError, OSError, TypeError, ValueError):
        pass
    folder = Path(__file__).resolve().parent.parent / "templates"
    return [(p.stem, str(p), p.read_text(encoding="utf-8")) for p in folder.glob("*.jinja")]


@functools.lru_cache(maxsize=1)
def _builtins() -> tuple[BuiltinTemplate, ...]:
    templates = [_builtin_from_text(name, path, text) for name, path, text in _template_files()]
    if not templates:
        raise TemplateError("no built-in chat templates found (the llmchat installation is incomplete); reinstall llmchat")
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


# =================================================================================================
# The sandbox
# =================================================================================================
class _LimitExceeded(BaseException):
    """A render ran past a limit. A BaseException so no `except Exception` on the way can swallow it."""


class _TemplateRenderError(TemplateError):
    """A TemplateError that also says what kind of failure it was, for the system-prompt probe."""

    def __init__(self, message: str, kind: str, detail: str = ""):
        super().__init__(message)
        self.kind = kind  # "raised" | "error" | "refused" | "limit"
        self.detail = detail or message  # the reason alone, without the source and the hint


class _Budget:
    """Steps, time and produced text of one render."""

    __slots__ = ("steps_left", "step_limit", "deadline", "time_limit", "produced")

    def __init__(self) -> None:
        self.step_limit = RENDER_STEP_LIMIT
        self.steps_left = RENDER_STEP_LIMIT
        self.time_limit = RENDER_TIME_LIMIT_S
        self.deadline = time.monotonic() + RENDER_TIME_LIMIT_S
        self.produced = 0

    def tick(self) -> None:
        self.steps_left -= 1
        if self.steps_left <= 0:
            raise _LimitExceeded(f"it took more than {self.step_limit:,} loop iterations and calls")
        if self.steps_left % 512 == 0 and time.monotonic() > self.deadline:
            raise _LimitExceeded(f"it ran longer than {self.time_limit:g} s")

    def produce(self, chars: int) -> None:
        self.produced += chars
        if self.produced > MAX_PRODUCED_CHARS:
            raise _LimitExceeded(f"it produced more than {MAX_PRODUCED_CHARS:,} characters of text")


_ACTIVE_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("llmchat_template_budget", default=None)


def _budget() -> _Budget:
    budget = _ACTIVE_BUDGET.get()
    # Outside _render_text (someone rendering a compiled template directly) each guard gets a
    # fresh budget: sizes are still checked, steps and time are not.
    return budget if budget is not None else _Budget()


def _text_size(value: Any, limit: int) -> int:
    """About how many characters str(value) has, without building it; stops counting past `limit`."""
    from jinja2.utils import Namespace

    total, visited, stack = 0, 0, [value]
    while stack and total <= limit:
        item = stack.pop()
        visited += 1
        if visited > MAX_VALUE_ITEMS:
            return limit + 1
        if isinstance(item, str):
            total += len(item) + 2
        elif isinstance(item, (list, tuple, set, frozenset)):
            total += 2 + 2 * len(item)
            stack.extend(item)
        elif isinstance(item, dict):
            total += 2 + 4 * len(item)
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, Namespace):
            attrs = getattr(item, "_Namespace__attrs", {})
            total += 16
            stack.append(dict(attrs))
        elif isinstance(item, int):
            total += item.bit_length() // 3 + 2
        else:
            total += 32  # floats, None, Undefined, macros, loop objects: short reprs
    return total


def _refuse(what: str) -> None:
    raise _LimitExceeded(what)


def _check_chars(chars: int, what: str) -> None:
    if chars > MAX_VALUE_CHARS:
        _refuse(f"{what} would build a string of {chars:,} characters (limit {MAX_VALUE_CHARS:,})")


def _check_items(items: int, what: str) -> None:
    if items > MAX_VALUE_ITEMS:
        _refuse(f"{what} would build a list of {items:,} items (limit {MAX_VALUE_ITEMS:,})")


def _check_value(value: Any, what: str) -> Any:
    if isinstance(value, str):
        _check_chars(len(value), what)
    elif isinstance(value, (list, tuple, dict, set, frozenset)):
        _check_items(len(value), what)
    return value


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_BIG_NUMBER_RE = re.compile(r"\d{7,}")
_PRINTF_STAR_RE = re.compile(r"%[#0 +\-]*(\*|\d*\.\*)")  # %*d, %.*f: width from the arguments
_NESTED_FIELD_RE = re.compile(r"\{[^{}]*\{")  # {:>{w}}: width from the arguments


def _check_format_string(fmt: str, args: Iterable[Any], what: str) -> None:
    """printf- and str.format-style widths can ask for huge padding: `'%999999999d' % 1`."""
    if _BIG_NUMBER_RE.search(fmt):
        _refuse(f"{what} has a field width or precision of a million or more")
    if _PRINTF_STAR_RE.search(fmt.replace("%%", "")) or _NESTED_FIELD_RE.search(fmt.replace("{{", "")):
        for arg in args:
            if _is_count(arg) and abs(arg) > MAX_VALUE_CHARS:
                _refuse(f"{what} asks for a field width of {arg:,}")


def _replace_size(text: str, old: Any, new: Any, count: Any = -1) -> int:
    if not (isinstance(old, str) and isinstance(new, str)):
        return len(text)
    hits = len(text) + 1 if old == "" else text.count(old)
    if _is_count(count) and count >= 0:
        hits = min(hits, count)
    return len(text) + hits * max(0, len(new) - len(old))


def _join_size(items: Sequence[Any], separator: str) -> int:
    budget = MAX_VALUE_CHARS
    total = len(separator) * max(0, len(items) - 1)
    for item in items:
        total += _text_size(item, budget)
        if total > budget:
            break
    return total


def _materialize(value: Any) -> Any:
    """A lazy iterable as a list (bounded), so a size check does not consume it."""
    if isinstance(value, (str, list, tuple, dict, set, frozenset)):
        return value
    try:
        items = list(itertools.islice(iter(value), MAX_VALUE_ITEMS + 1))
    except TypeError:
        return value
    _check_items(len(items), "an iterable")
    return items


# --- checks before str methods ------------------------------------------------------------------
def _check_str_method(owner: str, name: str, args: tuple, kwargs: dict) -> tuple:
    """Refuse str method calls whose result would be huge; returns possibly materialized args."""
    what = f"str.{name}()"
    first = args[0] if args else None
    if name in ("ljust", "rjust", "center", "zfill"):
        width = kwargs.get("width", first)
        if _is_count(width):
            _check_chars(width, what)
    elif name == "expandtabs":
        tabsize = kwargs.get("tabsize", first if first is not None else 8)
        if _is_count(tabsize):
            _check_chars(len(owner) + owner.count("\t") * max(0, tabsize), what)
    elif name == "replace" and len(args) >= 2:
        _check_chars(_replace_size(owner, args[0], args[1], args[2] if len(args) > 2 else kwargs.get("count", -1)), what)
    elif name == "join" and args:
        items = _materialize(args[0])
        if isinstance(items, (list, tuple)):
            _check_chars(_join_size(items, owner), what)
        args = (items, *args[1:])
    elif name in ("format", "format_map"):
        _check_format_string(owner, itertools.chain(args, kwargs.values()), what)
    return args


# --- filters ------------------------------------------------------------------------------------
def _filter_value_and_args(args: tuple) -> tuple[int, list]:
    """Index of the filtered value (after any environment/context passed first) and the arguments."""
    from jinja2.environment import Environment
    from jinja2.nodes import EvalContext
    from jinja2.runtime import Context

    start = 0
    while start < len(args) and isinstance(args[start], (Environment, Context, EvalContext)):
        start += 1
    return start, list(args)


def _precheck_filter(name: str, args: tuple, kwargs: dict) -> tuple:
    start, items = _filter_value_and_args(args)
    if start >= len(items):
        return args
    value, params = items[start], items[start + 1 :]
    what = f"the {name} filter"

    def param(index: int, key: str, default: Any = None) -> Any:
        return kwargs.get(key, params[index] if len(params) > index else default)

    if name == "join":
        value = _materialize(value)
        items[start] = value
        if isinstance(value, (list, tuple)):
            _check_chars(_join_size(value, str(param(0, "d", ""))), what)
    elif name == "replace" and isinstance(value, str):
        _check_chars(_replace_size(value, param(0, "old"), param(1, "new"), param(2, "count", -1)), what)
    elif name == "center":
        width = param(0, "width", 80)
        if _is_count(width):
            _check_chars(width, what)
    elif name == "indent" and isinstance(value, str):
        width = param(0, "width", 4)
        pad = width if _is_count(width) else len(str(width))
        _check_chars(len(value) + (value.count("\n") + 1) * max(0, pad), what)
    elif name == "wordwrap" and isinstance(value, str):
        width = param(0, "width", 79)
        wrapstring = param(2, "wrapstring", "\n") or "\n"
        lines = len(value) // max(1, width if _is_count(width) else 1) + value.count("\n") + 1
        _check_chars(len(value) + lines * len(str(wrapstring)), what)
    elif name == "format" and isinstance(value, str):
        _check_format_string(value, itertools.chain(params, kwargs.values()), what)
    elif name in ("batch", "slice"):
        count = param(0, "linecount" if name == "batch" else "slices", 1)
        if _is_count(count):
            _check_items(count, what)
    elif name == "tojson":
        indent = param(1, "indent")
        if indent is not None and (indent if _is_count(indent) else len(str(indent))) > MAX_TOJSON_INDENT:
            _refuse(f"{what} indent is larger than {MAX_TOJSON_INDENT}")
    if name in ("tojson", "string", "pprint", "list", "join", "sum", "e", "escape", "forceescape", "urlize"):
        _check_chars(_text_size(items[start], MAX_VALUE_CHARS), what)
    return tuple(items)


def _guarded_filter(name: str, func: Any) -> Any:
    @functools.wraps(func)  # keeps jinja_pass_arg, so Jinja still passes the environment/context
    def guarded(*args: Any, **kwargs: Any) -> Any:
        _budget().tick()
        args = _precheck_filter(name, args, kwargs)
        return _check_value(func(*args, **kwargs), f"the {name} filter")

    return guarded


# --- the functions HF templates expect ------------------------------------------------------------
def _hf_tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False) -> str:
    """transformers' tojson: plain JSON text (Jinja's own escapes <, >, & and ' for HTML)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:  # noqa: A002 - the name templates call it with
    return datetime.now().strftime(format)


@functools.lru_cache(maxsize=1)
def _environment() -> Any:
    """The one sandboxed environment all templates compile in (built on first use: jinja2 is
    imported lazily so `llmchat --help` does not pay for it)."""
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class TemplateRaised(jinja2.TemplateError):
        """raise_exception() in a template: the template's own refusal, with its own message."""

    class GenerationTag(Extension):
        """transformers' `{% generation %}...{% endgeneration %}` marks assistant text for training
        masks; for rendering it is a no-op around its body."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    def raise_exception(message: Any) -> None:
        raise TemplateRaised(str(message))

    class GuardedEnvironment(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"+", "*", "**", "%"})

        def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
            _budget().tick()
            if any(obj is guard for guard in self.llmchat_guards):
                # Jinja passes loop/block variables for pass_context callables; guards take none.
                kwargs.pop("_loop_vars", None)
                kwargs.pop("_block_vars", None)
                return obj(*args, **kwargs)
            owner = getattr(obj, "__self__", None)
            if isinstance(owner, str):
                args = _check_str_method(owner, getattr(obj, "__name__", ""), args, kwargs)
            return _check_value(super().call(context, obj, *args, **kwargs), "a call")

        def wrap_str_format(self, value: Any) -> Any:
            # Jinja hands out a wrapper for str.format/format_map at attribute access, so the
            # width check has to wrap that wrapper: `'{:>999999999}'.format(1)`.
            wrapped = super().wrap_str_format(value)
            if wrapped is None:
                return None
            fmt = value.__self__

            def checked(*args: Any, **kwargs: Any) -> str:
                mappings = [a for a in args if isinstance(a, Mapping)]
                values = itertools.chain(args, kwargs.values(), *(m.values() for m in mappings))
                _check_format_string(fmt, values, f"str.{value.__name__}()")
                return wrapped(*args, **kwargs)

            return checked

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            _budget().tick()
            _check_binop(operator, left, right)
            return _check_value(super().call_binop(context, operator, left, right), f"the {operator} operator")

    env = GuardedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
        extensions=[loopcontrols, GenerationTag],
    )
    for unneeded in ("cycler", "joiner", "lipsum"):
        env.globals.pop(unneeded, None)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.filters["tojson"] = _hf_tojson
    env.filters = {name: _guarded_filter(name, func) for name, func in env.filters.items()}

    # Called from the code _GuardInserter adds; reached as `environment.<name>`, so a template
    # cannot rebind them.
    env.llmchat_guard_iter = _guard_iter
    env.llmchat_guard_concat = _guard_concat
    env.llmchat_guard_output = _guard_output
    env.llmchat_guards = (_guard_iter, _guard_concat, _guard_output)
    env.llmchat_template_raised = TemplateRaised
    return env


def _check_binop(operator: str, left: Any, right: Any) -> None:
    if operator == "*":
        if _is_count(left) and _is_count(right):
            if left.bit_length() + right.bit_length() > MAX_INT_BITS:
                _refuse(f"a multiplication would build an integer of more than {MAX_INT_BITS:,} bits")
            return
        sequence, times = (left, right) if _is_count(right) else (right, left)
        if _is_count(times) and isinstance(sequence, str):
            _check_chars(len(sequence) * max(0, times), "a string repetition")
        elif _is_count(times) and isinstance(sequence, (list, tuple)):
            _check_items(len(sequence) * max(0, times), "a list repetition")
    elif operator == "+":
        if isinstance(left, str) and isinstance(right, str):
            _check_chars(len(left) + len(right), "a string concatenation")
        elif isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
            _check_items(len(left) + len(right), "a list concatenation")
    elif operator == "**":
        if _is_count(left) and _is_count(right) and abs(left) > 1 and right > 0:
            if right * left.bit_length() > MAX_INT_BITS:
                _refuse(f"a power would build an integer of more than {MAX_INT_BITS:,} bits")
    elif operator == "%" and isinstance(left, str):
        _check_format_string(left, right if isinstance(right, tuple) else (right,), "a % format")


class _GuardedIterable:
    """What a `{% for %}` loop really iterates: the original iterable, one budget tick per item."""

    __slots__ = ("_items", "_budget")

    def __init__(self, items: Any, budget: _Budget):
        self._items = items
        self._budget = budget

    def __iter__(self) -> Iterator[Any]:
        tick = self._budget.tick
        for item in self._items:
            tick()
            yield item

    def __len__(self) -> int:  # loop.length / loop.last without materializing when possible
        return len(self._items)


def _guard_iter(items: Any) -> _GuardedIterable:
    return _GuardedIterable(items, _budget())


def _guard_concat(*parts: Any) -> str:
    """The `~` operator (Jinja's str_join), with the result's size checked before it is built."""
    total = 0
    for part in parts:
        total += _text_size(part, MAX_VALUE_CHARS)
        _check_chars(total, "the ~ operator")
    return "".join(map(str, parts))


def _guard_output(value: Any) -> Any:
    """Every `{{ ... }}` and every piece of literal text, wherever it is written (top level,
    macros, {% set %} blocks): counted so a render cannot produce unbounded text."""
    size = len(value) if isinstance(value, str) else _text_size(value, MAX_VALUE_CHARS)
    _check_chars(size, "an output expression")
    _budget().produce(size)
    return value


def _guarded_ast(env: Any, source: str, label: str) -> Any:
    """Parse, refuse file-loading tags, and route loops, `~` and outputs through the guards."""
    from jinja2 import nodes
    from jinja2.visitor import NodeTransformer

    forbidden = {
        nodes.Include: "{% include %}",
        nodes.Import: "{% import %}",
        nodes.FromImport: "{% from ... import %}",
        nodes.Extends: "{% extends %}",
    }

    def guard_call(name: str, args: list[Any], lineno: int) -> Any:
        call = nodes.Call(nodes.EnvironmentAttribute(name), list(args), [], None, None)
        return call.set_lineno(lineno).set_environment(env)

    class GuardInserter(NodeTransformer):
        def visit_For(self, node: Any) -> Any:
            self.generic_visit(node)
            node.iter = guard_call("llmchat_guard_iter", [node.iter], node.lineno)
            return node

        def visit_Concat(self, node: Any) -> Any:
            self.generic_visit(node)
            return guard_call("llmchat_guard_concat", node.nodes, node.lineno)

        def visit_Output(self, node: Any) -> Any:
            self.generic_visit(node)
            node.nodes = [guard_call("llmchat_guard_output", [child], child.lineno or node.lineno) for child in node.nodes]
            return node

    tree = env.parse(source)
    for node_type, tag in forbidden.items():
        found = next(iter(tree.find_all(node_type)), None)
        if found is not None:
            raise _TemplateRenderError(
                f"{label} uses {tag} (line {found.lineno}), which loads other files; templates must be "
                f"self-contained, so it was refused and nothing was run; {OVERRIDE_HINT}",
                "refused",
            )
    return GuardInserter().visit(tree)


def _compile(source: str, label: str) -> Any:
    import jinja2

    if len(source) > MAX_TEMPLATE_CHARS:
        raise _TemplateRenderError(
            f"{label} is {len(source):,} characters long (limit {MAX_TEMPLATE_CHARS:,}), far beyond any real chat "
            f"template, so it was refused; {OVERRIDE_HINT}",
            "refused",
        )
    env = _environment()
    try:
        tree = _guarded_ast(env, source, label)
        return env.from_string(tree)
    except RecursionError:
        raise _TemplateRenderError(f"{label} is nested too deeply to compile; {OVERRIDE_HINT}", "refused") from None
    except jinja2.TemplateSyntaxError as err:
        raise _TemplateRenderError(
            f"{label} has a syntax error on line {err.lineno}: {err.message}; {OVERRIDE_HINT}", "error"
        ) from None
    except jinja2.TemplateError as err:
        raise _TemplateRenderError(f"{label} cannot be compiled: {err}; {OVERRIDE_HINT}", "error") from None


def _render_text(compiled: Any, context: Mapping[str, Any], label: str) -> str:
    """One render under a fresh budget; every failure becomes a _TemplateRenderError."""
    from jinja2.exceptions import SecurityError

    env = _environment()
    budget = _Budget()
    token = _ACTIVE_BUDGET.set(budget)
    chunks: list[str] = []
    size = 0
    try:
        for chunk in compiled.generate(**context):
            size += len(chunk)
            if size > MAX_PROMPT_CHARS:
                raise _LimitExceeded(f"its output passed {MAX_PROMPT_CHARS:,} characters")
            chunks.append(chunk)
    except _LimitExceeded as err:
        raise _TemplateRenderError(f"{label} was stopped: {err}; {OVERRIDE_HINT}", "limit") from None
    except SecurityError as err:
        raise _TemplateRenderError(
            f"{label} was refused by the sandbox ({err}): it tried to reach Python internals, and nothing "
            f"was run; {OVERRIDE_HINT}",
            "refused",
        ) from None
    except env.llmchat_template_raised as err:
        raise _TemplateRenderError(f"{label} raised an error: {err.message}; {OVERRIDE_HINT}", "raised", str(err.message)) from None
    except RecursionError:
        raise _TemplateRenderError(f"{label} was stopped: it recursed too deeply; {OVERRIDE_HINT}", "limit") from None
    except MemoryError:
        raise _TemplateRenderError(f"{label} was stopped: it ran out of memory; {OVERRIDE_HINT}", "limit") from None
    except Exception as err:  # jinja2 errors, TypeError, OverflowError from range(): the template's bug
        detail = f"{type(err).__name__}: {err}"
        raise _TemplateRenderError(f"{label} failed to render ({detail}); {OVERRIDE_HINT}", "error", detail) from None
    finally:
        _ACTIVE_BUDGET.reset(token)
    return "".join(chunks)


# =================================================================================================
# Rendering and pieces
# =================================================================================================
def _normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    normalized = []
    for number, message in enumerate(messages, start=1):
        if not isinstance(message, Mapping):
            raise UsageError(f"message {number} is not an object with role and content")
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not role:
            raise UsageError(f"message {number} has no role (a string such as user, assistant or system)")
        if not isinstance(content, str):
            raise UsageError(f"message {number} ({role}) has no content string")
        normalized.append({"role": role, "content": content})
    return normalized


def fold_system_messages(messages: Sequence[Mapping[str, str]]) -> list[dict[str, str]]:
    """System messages moved into the next user message as system + "\\n" + user (llama.cpp's
    convention for templates without a system role). A system message with no user message after
    it becomes a user message of its own."""
    folded: list[dict[str, str]] = []
    pending: list[str] = []
    for message in messages:
        if message["role"] == "system":
            if message["content"]:
                pending.append(message["content"])
            continue
        if pending and message["role"] == "user":
            message = {"role": "user", "content": "\n".join([*pending, message["content"]])}
            pending = []
        folded.append(dict(message))
    if pending:
        folded.append({"role": "user", "content": "\n".join(pending)})
    return folded


def _context(messages: list[dict[str, str]], facts: ModelFacts, add_generation_prompt: bool) -> dict[str, Any]:
    return {
        "messages": messages,
        "add_generation_prompt": add_generation_prompt,
        "bos_token": facts.bos_token,
        "eos_token": facts.eos_token,
    }


def render_prompt(
    resolved: ResolvedTemplate,
    messages: Sequence[Mapping[str, str]],
    facts: ModelFacts,
    add_generation_prompt: bool = True,
) -> RenderedPrompt:
    """The prompt for `messages`, as text and as trusted/untrusted pieces that join to that text."""
    conversation = _normalize_messages(messages)
    if resolved.system_mode == "folded":
        conversation = fold_system_messages(conversation)
    compiled = resolved.compiled()
    label = resolved.source_detail
    reference = _render_text(compiled, _context(conversation, facts, add_generation_prompt), label)
    pieces, notes = _pieces(compiled, conversation, facts, add_generation_prompt, reference, label)
    return RenderedPrompt(reference, pieces, notes)


def _placeholder(index: int) -> str:
    return f"{_PLACEHOLDER_OPEN}{index}{_PLACEHOLDER_CLOSE}"


_ALL_CONTENTS_NOTE = (
    "the template rewrites message text, so this prompt was tokenized as template text: "
    "special-token text inside messages (such as <|im_end|>) was not neutralized"
)
_ASSISTANT_REWRITE_NOTE = (
    "the template rewrites assistant replies (for example it drops reasoning), so earlier replies were "
    "tokenized as template text; user and system text stayed plain text"
)


def _pieces(
    compiled: Any,
    conversation: list[dict[str, str]],
    facts: ModelFacts,
    add_generation_prompt: bool,
    reference: str,
    label: str,
) -> tuple[tuple[Piece, ...], tuple[str, ...]]:
    """Split the reference render into template text and message contents.

    First every content is protected. Reasoning templates rewrite assistant replies (Qwen3 and
    DeepSeek R1 drop `<think>` blocks), which breaks that; the second try protects only user and
    system text, the part that comes from outside. Failing both, the prompt is one trusted piece.
    """
    if not any(message["content"] for message in conversation):
        return ((Piece(reference, True),) if reference else ()), ()
    attempts = (
        ({i for i, m in enumerate(conversation) if m["content"]}, ()),
        ({i for i, m in enumerate(conversation) if m["content"] and m["role"] != "assistant"}, (_ASSISTANT_REWRITE_NOTE,)),
    )
    for protected, notes in attempts:
        if not protected:
            continue
        spliced = _protected_pieces(compiled, conversation, protected, facts, add_generation_prompt, reference, label)
        if spliced is not None:
            return spliced, notes
    return (Piece(reference, True),), (_ALL_CONTENTS_NOTE,)


def _protected_pieces(
    compiled: Any,
    conversation: list[dict[str, str]],
    protected: set[int],
    facts: ModelFacts,
    add_generation_prompt: bool,
    reference: str,
    label: str,
) -> tuple[Piece, ...] | None:
    """Render with placeholders for the `protected` contents and splice the contents back in.
    Empty contents are never replaced: there is nothing to protect, and `{% if content %}` must
    take the same branch in both renders."""
    skeleton_messages = [
        {"role": message["role"], "content": _placeholder(index) if index in protected else message["content"]}
        for index, message in enumerate(conversation)
    ]
    try:
        skeleton = _render_text(compiled, _context(skeleton_messages, facts, add_generation_prompt), label)
    except _TemplateRenderError as err:
        if err.kind in ("refused", "limit"):
            raise
        return None
    return _splice(reference, skeleton, [message["content"] for message in conversation])


def _content_variants(content: str) -> list[str]:
    """The forms templates commonly print a content in: as is, or trimmed (`| trim`, `.strip()`)."""
    variants: list[str] = []
    for variant in (content, content.strip(), content.rstrip(), content.lstrip()):
        if variant not in variants:
            variants.append(variant)
    return variants


def _splice(reference: str, skeleton: str, contents: Sequence[str]) -> tuple[Piece, ...] | None:
    """Pieces from the skeleton render with each placeholder replaced by its content, or None
    when that does not give back exactly the reference render."""
    parts = _PLACEHOLDER_RE.split(skeleton)  # literal, index, literal, index, ..., literal
    literals, indexes = parts[0::2], parts[1::2]
    if any(_PLACEHOLDER_OPEN in lit or _PLACEHOLDER_CLOSE in lit for lit in literals):
        return None  # a placeholder was cut or rewritten: the template transforms contents
    pieces: list[Piece] = []
    pos = 0
    for number, literal in enumerate(literals):
        if not reference.startswith(literal, pos):
            return None
        pieces.append(Piece(literal, True))
        pos += len(literal)
        if number == len(indexes):
            break
        index = int(indexes[number])
        if index >= len(contents):
            return None
        following = literals[number + 1]
        variant = next(
            (v for v in _content_variants(contents[index]) if reference.startswith(v, pos) and reference.startswith(following, pos + len(v))),
            None,
        )
        if variant is None:
            return None
        pieces.append(Piece(variant, False))
        pos += len(variant)
    if pos != len(reference):
        return None
    return _merge_pieces(pieces)


def _merge_pieces(pieces: Iterable[Piece]) -> tuple[Piece, ...]:
    merged: list[Piece] = []
    for piece in pieces:
        if not piece.text:
            continue
        if merged and merged[-1].trusted == piece.trusted:
            merged[-1] = Piece(merged[-1].text + piece.text, piece.trusted)
        else:
            merged.append(piece)
    return tuple(merged)


# =================================================================================================
# System-prompt probe
# =================================================================================================
def _probe_render(compiled: Any, messages: list[dict[str, str]], facts: ModelFacts, label: str) -> str:
    return _render_text(compiled, _context(messages, facts, True), label)


def _probe_system_handling(compiled: Any, facts: ModelFacts, label: str) -> tuple[str, list[str]]:
    """("native" | "folded", notes). Raises TemplateError when even a lone user message fails."""
    user = {"role": "user", "content": _PROBE_USER}
    user_only = _probe_render(compiled, [user], facts, label)
    if _PROBE_USER.lower() not in user_only.lower():
        raise TemplateError(f"{label} leaves out the user's message when rendering a conversation; {OVERRIDE_HINT}")

    system = {"role": "system", "content": _PROBE_SYSTEM}
    try:
        with_system = _probe_render(compiled, [system, user], facts, label)
    except _TemplateRenderError as err:
        if err.kind not in ("raised", "error"):
            raise
        return "folded", [
            f"the template refuses a system message ({err.detail}); the system prompt is put in front of the first user message"
        ]
    if _PROBE_SYSTEM.lower() not in with_system.lower():
        return "folded", ["the template drops the system message; the system prompt is put in front of the first user message"]

    notes = []
    if _adds_default_system_prompt(compiled, facts, label, user_only):
        notes.append("the template adds its own default system prompt when the conversation has none (kept: it is the model's own behaviour)")
    return "native", notes


def _adds_default_system_prompt(compiled: Any, facts: ModelFacts, label: str, user_only: str) -> bool:
    """True when a lone user message gets more text in front of it than a user message after an
    empty system message: the template wrote a system prompt of its own."""
    try:
        empty_system = _probe_render(
            compiled, [{"role": "system", "content": ""}, {"role": "user", "content": _PROBE_USER}], facts, label
        )
    except TemplateError:
        return False
    before_user = user_only.lower().find(_PROBE_USER.lower())
    before_user_with_empty_system = empty_system.lower().find(_PROBE_USER.lower())
    return before_user_with_empty_system >= 0 and before_user > before_user_with_empty_system


# =================================================================================================
# Resolution
# =================================================================================================
@dataclass(frozen=True)
class _Candidate:
    name: str
    source: str
    source_detail: str
    text: str
    stop_strings: tuple[str, ...]
    warning: str | None = None


@dataclass(frozen=True)
class _Match:
    template: BuiltinTemplate
    score: tuple[int, int, int]  # (marker tokens present, name matched, architecture matched)
    reasons: tuple[str, ...]


def _normalize_name(text: str) -> str:
    return re.sub(r"[\s_]+", "-", text.strip().lower())


def _match_builtin(template: BuiltinTemplate, facts: ModelFacts) -> _Match | None:
    if facts.vocab_known and template.match_tokens and not all(facts.has_token(t) for t in template.match_tokens):
        return None  # its turn markers are not in this vocabulary: it cannot be this model's format
    tokens = [t for t in template.match_tokens if facts.has_token(t)]
    model_names = [_normalize_name(n) for n in (facts.name, facts.basename) if n]
    names = [pattern for pattern in template.match_names if any(pattern in n for n in model_names)]
    arch = bool(facts.architecture) and facts.architecture.lower() in template.match_architectures
    if not (tokens or names or arch):
        return None
    reasons = []
    if tokens:
        reasons.append("tokens " + " ".join(tokens))
    if names:
        reasons.append(f"name contains {names[0]!r}")
    if arch:
        reasons.append(f"architecture {facts.architecture}")
    return _Match(template, (len(tokens), int(bool(names)), int(arch)), tuple(reasons))


def match_builtins(facts: ModelFacts) -> list[_Match]:
    """Built-ins that match the model, best first (ties: alphabetical, so the choice is stable)."""
    matches = [m for m in (_match_builtin(t, facts) for t in _builtins()) if m is not None]
    return sorted(matches, key=lambda m: (tuple(-s for s in m.score), m.template.name))


def _choice_candidate(choice: str, source: str) -> _Candidate:
    """A NAME|PATH choice from --template (source "flag") or the config file (source "config")."""
    where = "--template" if source == "flag" else "the config file's template"
    builtin = builtin_template(choice)
    if builtin is not None:
        return _Candidate(builtin.name, source, f"built-in template '{builtin.name}' ({where})", builtin.text, builtin.stop_strings)
    path = Path(choice).expanduser()
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise UsageError(f"cannot read template file {path} ({where}): {err}") from None
        label = f"template file {path} ({where})"
        return _Candidate(path.stem, source, label, text, _declared_or_inferred_stops(text, label))
    names = ", ".join(t.name for t in _builtins())
    raise UsageError(f"unknown template {choice!r} ({where}): not a file and not a built-in ({names})")


def _declared_or_inferred_stops(text: str, label: str) -> tuple[str, ...]:
    try:
        declared = parse_template_header(text, label).get("stop", [])
    except TemplateError:
        declared = []
    return tuple(declared) or infer_stop_strings(text)


def infer_stop_strings(text: str, eos_token: str = "") -> tuple[str, ...]:
    """Stop strings for a template without a header: the known end-of-turn markers it mentions,
    plus the model's EOS text when the template writes `eos_token`."""
    stops = [marker for marker in KNOWN_STOP_MARKERS if marker in text]
    if eos_token and "eos_token" in text and eos_token not in stops:
        stops.append(eos_token)
    return tuple(stops)


def _fallback_warning(facts: ModelFacts) -> str:
    described = ", ".join(
        f"{label} {value!r}" for label, value in (("architecture", facts.architecture), ("name", facts.name or facts.basename)) if value
    )
    about = f" ({described})" if described else ""
    return (
        f"this model{about} has no chat template and no built-in template matches it; using ChatML. "
        f"If replies look wrong, pick one with --template NAME (see `llmchat template list`)"
    )


def resolve_template(facts: ModelFacts, user_choice: str | None = None, config_choice: str | None = None) -> ResolvedTemplate:
    """Choose the template (see the module docstring for the order), compile it and probe it."""
    steps: list[str] = []
    candidate: _Candidate | None = None

    if user_choice:
        candidate = _choice_candidate(user_choice, "flag")
        steps.append(f"1. --template {user_choice}: {candidate.source_detail} -> chosen")
    else:
        steps.append("1. --template: not given")

    if config_choice and candidate is None:
        candidate = _choice_candidate(config_choice, "config")
        steps.append(f"2. config file: template {config_choice!r}: {candidate.source_detail} -> chosen")
    else:
        steps.append(f"2. config file: template {config_choice!r} (not used: --template wins)" if config_choice else "2. config file: no template for this model")

    steps.append("3. " + _gguf_step(facts, chosen=candidate is None and bool(facts.chat_template)))
    if candidate is None and facts.chat_template:
        label = "GGUF tokenizer.chat_template"
        candidate = _Candidate("gguf", "gguf", label, facts.chat_template, infer_stop_strings(facts.chat_template, facts.eos_token))

    matches = match_builtins(facts)
    steps.append("4. " + _builtin_step(matches, chosen=candidate is None and bool(matches)))
    if candidate is None and matches:
        best = matches[0].template
        detail = f"built-in template '{best.name}' (matched on {', '.join(matches[0].reasons)})"
        candidate = _Candidate(best.name, "builtin", detail, best.text, best.stop_strings)

    if candidate is None:
        fallback = builtin_template(FALLBACK_TEMPLATE)
        assert fallback is not None, "chatml.jinja ships with llmchat"
        warning = _fallback_warning(facts)
        candidate = _Candidate(fallback.name, "fallback", "built-in template 'chatml' (fallback)", fallback.text, fallback.stop_strings, warning)
        steps.append("5. fallback: ChatML -> chosen")
    else:
        steps.append("5. fallback: not needed")

    return _prepare(candidate, facts, steps)


def _gguf_step(facts: ModelFacts, *, chosen: bool) -> str:
    named = sorted(facts.named_templates)
    named_text = f"; named variants {', '.join(named)} are not used" if named else ""
    if not facts.chat_template:
        return f"GGUF tokenizer.chat_template: not present{named_text}"
    verdict = "chosen" if chosen else "present, not used"
    return f"GGUF tokenizer.chat_template: {len(facts.chat_template):,} characters -> {verdict}{named_text}"


def _builtin_step(matches: list[_Match], *, chosen: bool) -> str:
    if not matches:
        return "built-in match: none"
    best = matches[0]
    text = f"built-in match: '{best.template.name}' ({', '.join(best.reasons)})"
    if len(matches) > 1:
        text += "; also " + ", ".join(f"'{m.template.name}'" for m in matches[1:4])
    return text + (" -> chosen" if chosen else " (not used)")


def _prepare(candidate: _Candidate, facts: ModelFacts, steps: list[str]) -> ResolvedTemplate:
    resolved = ResolvedTemplate(
        name=candidate.name,
        source=candidate.source,
        source_detail=candidate.source_detail,
        text=candidate.text,
        stop_strings=candidate.stop_strings,
        warning=candidate.warning,
        steps=steps,
    )
    mode, notes = _probe_system_handling(resolved.compiled(), facts, resolved.source_detail)
    resolved.system_mode = mode
    resolved.notes.extend(notes)
    if not resolved.stop_strings:
        resolved.notes.append("no stop strings known for this template; generation ends at the model's end-of-generation tokens")
    return resolved


# =================================================================================================
# Model facts from GGUF metadata
# =================================================================================================
def _token_at(token_texts: Sequence[str], index: Any) -> str:
    if isinstance(index, int) and not isinstance(index, bool) and 0 <= index < len(token_texts):
        return token_texts[index]
    return ""


def facts_from_metadata(meta: Mapping[str, Any], token_texts: Sequence[str] | None = None) -> ModelFacts:
    """ModelFacts from GGUF scalar metadata and, when given, the vocabulary (`tokenizer.ggml.tokens`)."""

    def text(key: str) -> str:
        value = meta.get(key)
        return value if isinstance(value, str) else ""

    prefix = "tokenizer.chat_template."
    named = {key[len(prefix) :]: value for key, value in meta.items() if key.startswith(prefix) and isinstance(value, str)}
    tokens: frozenset[str] = frozenset()
    bos = eos = ""
    if token_texts is not None:
        vocabulary = set(token_texts)
        tokens = frozenset(marker for marker in marker_tokens() if marker in vocabulary)
        bos = _token_at(token_texts, meta.get("tokenizer.ggml.bos_token_id"))
        eos = _token_at(token_texts, meta.get("tokenizer.ggml.eos_token_id"))
    return ModelFacts(
        architecture=text("general.architecture"),
        name=text("general.name"),
        basename=text("general.basename"),
        chat_template=text("tokenizer.chat_template") or None,
        named_templates=named,
        bos_token=bos,
        eos_token=eos,
        tokens=tokens,
        vocab_known=token_texts is not None,
    )


def facts_from_gguf(path: str | Path) -> ModelFacts:
    """ModelFacts of a GGUF file, read with llmchat's fast header reader (no llama.cpp)."""
    from llmchat.errors import ModelError
    from llmchat.gguf_file import read_metadata

    meta = read_metadata(path)
    try:
        token_texts: Sequence[str] | None = meta.token_texts()
    except ModelError:
        token_texts = None
    return facts_from_metadata(meta.scalars, token_texts)
