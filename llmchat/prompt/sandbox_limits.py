"""The limits a chat template renders under, and the checks that hold a render to them.

A template from a GGUF file is someone else's code (llmchat.prompt.sandbox runs it). These
guards make sure no template can hang or exhaust memory: every loop iteration, call and operator
ticks a per-render budget of steps and time, and every string, list or integer is measured before
`*`, `+`, `~`, `%`, `join`, `replace`, `ljust`, a filter... build it. A guard that trips raises
`RenderLimitExceeded`, which the sandbox turns into a one-line `TemplateRenderError`.

The limits are module attributes (not constants baked into functions) so tests can lower them.
"""

from __future__ import annotations

import contextvars
import functools
import itertools
import re
import time
from typing import Any, Iterable, Iterator, Sequence, TypeGuard

# --- limits --------------------------------------------------------------------------------
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


class RenderLimitExceeded(BaseException):
    """A render ran past a limit. A BaseException so no `except Exception` on the way can swallow it."""


class RenderBudget:
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
            raise RenderLimitExceeded(f"it took more than {self.step_limit:,} loop iterations and calls")
        if self.steps_left % 512 == 0 and time.monotonic() > self.deadline:
            raise RenderLimitExceeded(f"it ran longer than {self.time_limit:g} s")

    def produce(self, chars: int) -> None:
        self.produced += chars
        if self.produced > MAX_PRODUCED_CHARS:
            raise RenderLimitExceeded(f"it produced more than {MAX_PRODUCED_CHARS:,} characters of text")


ACTIVE_BUDGET: contextvars.ContextVar[RenderBudget | None] = contextvars.ContextVar(
    "llmchat_template_budget", default=None
)


def current_budget() -> RenderBudget:
    budget = ACTIVE_BUDGET.get()
    # Outside render_compiled (someone rendering a compiled template directly) each guard gets a
    # fresh budget: sizes are still checked, steps and time are not.
    return budget if budget is not None else RenderBudget()


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
    raise RenderLimitExceeded(what)


def _check_chars(chars: int, what: str) -> None:
    if chars > MAX_VALUE_CHARS:
        _refuse(f"{what} would build a string of {chars:,} characters (limit {MAX_VALUE_CHARS:,})")


def _check_items(items: int, what: str) -> None:
    if items > MAX_VALUE_ITEMS:
        _refuse(f"{what} would build a list of {items:,} items (limit {MAX_VALUE_ITEMS:,})")


def check_value(value: Any, what: str) -> Any:
    if isinstance(value, str):
        _check_chars(len(value), what)
    elif isinstance(value, (list, tuple, dict, set, frozenset)):
        _check_items(len(value), what)
    return value


def _is_count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


_BIG_NUMBER_RE = re.compile(r"\d{7,}")
_PRINTF_STAR_RE = re.compile(r"%[#0 +\-]*(\*|\d*\.\*)")  # %*d, %.*f: width from the arguments
_NESTED_FIELD_RE = re.compile(r"\{[^{}]*\{")  # {:>{w}}: width from the arguments


def check_format_string(fmt: str, args: Iterable[Any], what: str) -> None:
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


def materialize(value: Any) -> Any:
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
def check_str_method(owner: str, name: str, args: tuple, kwargs: dict) -> tuple:
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
        _check_chars(
            _replace_size(owner, args[0], args[1], args[2] if len(args) > 2 else kwargs.get("count", -1)), what
        )
    elif name == "join" and args:
        items = materialize(args[0])
        if isinstance(items, (list, tuple)):
            _check_chars(_join_size(items, owner), what)
        args = (items, *args[1:])
    elif name in ("format", "format_map"):
        check_format_string(owner, itertools.chain(args, kwargs.values()), what)
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
        value = materialize(value)
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
        check_format_string(value, itertools.chain(params, kwargs.values()), what)
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


def guarded_filter(name: str, func: Any) -> Any:
    @functools.wraps(func)  # keeps jinja_pass_arg, so Jinja still passes the environment/context
    def guarded(*args: Any, **kwargs: Any) -> Any:
        current_budget().tick()
        args = _precheck_filter(name, args, kwargs)
        return check_value(func(*args, **kwargs), f"the {name} filter")

    return guarded


def check_binop(operator: str, left: Any, right: Any) -> None:
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
        check_format_string(left, right if isinstance(right, tuple) else (right,), "a % format")


class _GuardedIterable:
    """What a `{% for %}` loop really iterates: the original iterable, one budget tick per item."""

    __slots__ = ("_items", "_budget")

    def __init__(self, items: Any, budget: RenderBudget):
        self._items = items
        self._budget = budget

    def __iter__(self) -> Iterator[Any]:
        tick = self._budget.tick
        for item in self._items:
            tick()
            yield item

    def __len__(self) -> int:  # loop.length / loop.last without materializing when possible
        return len(self._items)


def guard_iter(items: Any) -> _GuardedIterable:
    return _GuardedIterable(items, current_budget())


def guard_concat(*parts: Any) -> str:
    """The `~` operator (Jinja's str_join), with the result's size checked before it is built."""
    total = 0
    for part in parts:
        total += _text_size(part, MAX_VALUE_CHARS)
        _check_chars(total, "the ~ operator")
    return "".join(map(str, parts))


def guard_output(value: Any) -> Any:
    """Every `{{ ... }}` and every piece of literal text, wherever it is written (top level,
    macros, {% set %} blocks): counted so a render cannot produce unbounded text."""
    size = len(value) if isinstance(value, str) else _text_size(value, MAX_VALUE_CHARS)
    _check_chars(size, "an output expression")
    current_budget().produce(size)
    return value
