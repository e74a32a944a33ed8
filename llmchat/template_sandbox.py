"""The sandbox chat templates render in: a jinja2 ImmutableSandboxedEnvironment plus limits.

A chat template comes from whoever made the GGUF file, so rendering one is running someone
else's code. On top of jinja2's sandbox (which already refuses `__globals__`, `__subclasses__`
and every other underscore attribute) this module:
    * refuses `{% include %}`, `{% import %}`, `{% from %}` and `{% extends %}` (there is no loader);
    * drops the `cycler`, `joiner` and `lipsum` globals that templates never need;
    * counts every loop iteration and call and stops a render past RENDER_STEP_LIMIT steps or
      RENDER_TIME_LIMIT_S seconds, and checks string/list sizes before `*`, `+`, `~`, `%`,
      `join`, `replace`, `ljust`... build them, so neither `range(10**12)`, nested loops,
      recursive macros nor string doubling can hang or exhaust memory;
    * stops a render whose output passes MAX_PROMPT_CHARS.
Every failure becomes a `TemplateRenderError` (a TemplateError) that names the template's source
and the `--template` override, and says what kind of failure it was.

It follows Hugging Face's conventions (trim_blocks, lstrip_blocks, loopcontrols,
`raise_exception`, `strftime_now`, a `tojson` filter with ensure_ascii=False), so GGUF templates
written for `transformers` render the same here. The interface: `compile_template(source, label)`
and `render_compiled(compiled, context, label)`.
"""

from __future__ import annotations

import contextvars
import functools
import itertools
import json
import re
import time
from datetime import datetime
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, TypeGuard

from llmchat.errors import TemplateError

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


# --- budgets and errors -------------------------------------------------------------------------
class _LimitExceeded(BaseException):
    """A render ran past a limit. A BaseException so no `except Exception` on the way can swallow it."""


class TemplateRenderError(TemplateError):
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
    # Outside render_compiled (someone rendering a compiled template directly) each guard gets a
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


def _is_count(value: Any) -> TypeGuard[int]:
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
        _check_chars(
            _replace_size(owner, args[0], args[1], args[2] if len(args) > 2 else kwargs.get("count", -1)), what
        )
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
def _hf_tojson(
    value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    """transformers' tojson: plain JSON text (Jinja's own escapes <, >, & and ' for HTML). A lazy
    sequence (`tools | map(attribute='function')`, llama.cpp's own R1 template) is written as the
    list it stands for, as llama.cpp's renderer does."""
    return json.dumps(
        value,
        ensure_ascii=ensure_ascii,
        indent=indent,
        separators=separators,
        sort_keys=sort_keys,
        default=_json_default,
    )


def _json_default(value: Any) -> Any:
    items = _materialize(value)
    if isinstance(items, list):
        return items
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


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
        # Set once below; the code _GuardInserter adds reaches them as `environment.<name>`.
        llmchat_guard_iter: Callable[..., Any]
        llmchat_guard_concat: Callable[..., Any]
        llmchat_guard_output: Callable[..., Any]
        llmchat_guards: tuple[Callable[..., Any], ...]
        llmchat_template_raised: type[Exception]

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

        def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
            # Kimi K2's template keeps a queue in a list of its own (`ids.append(...)`, `.pop(0)`).
            # Lists the template built are its own business; the caller's (messages, tools) stay
            # immutable, as in the plain immutable sandbox.
            if isinstance(obj, list) and attr in _LIST_MUTATORS and id(obj) not in _PROTECTED.get():
                return True
            return bool(super().is_safe_attribute(obj, attr, value))

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


_LIST_MUTATORS = frozenset({"append", "pop"})
# ids of every list reachable from the render's context: the caller's data, never mutated.
_PROTECTED: contextvars.ContextVar[frozenset[int]] = contextvars.ContextVar("llmchat_protected", default=frozenset())


def _reachable_lists(value: Any, found: set[int], depth: int = 0) -> None:
    if depth > 64:
        return
    if isinstance(value, list):
        found.add(id(value))
        for item in value:
            _reachable_lists(item, found, depth + 1)
    elif isinstance(value, Mapping):
        for item in value.values():
            _reachable_lists(item, found, depth + 1)


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
            node.nodes = [
                guard_call("llmchat_guard_output", [child], child.lineno or node.lineno) for child in node.nodes
            ]
            return node

    tree = env.parse(source)
    for node_type, tag in forbidden.items():
        found = next(iter(tree.find_all(node_type)), None)
        if found is not None:
            raise TemplateRenderError(
                f"{label} uses {tag} (line {found.lineno}), which loads other files; templates must be "
                f"self-contained, so it was refused and nothing was run; {OVERRIDE_HINT}",
                "refused",
            )
    return GuardInserter().visit(tree)


def compile_template(source: str, label: str) -> Any:
    import jinja2

    if len(source) > MAX_TEMPLATE_CHARS:
        raise TemplateRenderError(
            f"{label} is {len(source):,} characters long (limit {MAX_TEMPLATE_CHARS:,}), far beyond any real chat "
            f"template, so it was refused; {OVERRIDE_HINT}",
            "refused",
        )
    env = _environment()
    try:
        tree = _guarded_ast(env, source, label)
        return env.from_string(tree)
    except RecursionError:
        raise TemplateRenderError(f"{label} is nested too deeply to compile; {OVERRIDE_HINT}", "refused") from None
    except jinja2.TemplateSyntaxError as err:
        raise TemplateRenderError(
            f"{label} has a syntax error on line {err.lineno}: {err.message}; {OVERRIDE_HINT}", "error"
        ) from None
    except jinja2.TemplateError as err:
        raise TemplateRenderError(f"{label} cannot be compiled: {err}; {OVERRIDE_HINT}", "error") from None


def render_compiled(compiled: Any, context: Mapping[str, Any], label: str) -> str:
    """One render under a fresh budget; every failure becomes a TemplateRenderError."""
    from jinja2.exceptions import SecurityError

    env = _environment()
    budget = _Budget()
    token = _ACTIVE_BUDGET.set(budget)
    protected: set[int] = set()
    _reachable_lists(dict(context), protected)
    protected_token = _PROTECTED.set(frozenset(protected))
    chunks: list[str] = []
    size = 0
    try:
        for chunk in compiled.generate(**context):
            size += len(chunk)
            if size > MAX_PROMPT_CHARS:
                raise _LimitExceeded(f"its output passed {MAX_PROMPT_CHARS:,} characters")
            chunks.append(chunk)
    except _LimitExceeded as err:
        raise TemplateRenderError(f"{label} was stopped: {err}; {OVERRIDE_HINT}", "limit") from None
    except SecurityError as err:
        raise TemplateRenderError(
            f"{label} was refused by the sandbox ({err}): it tried to reach Python internals, and nothing "
            f"was run; {OVERRIDE_HINT}",
            "refused",
        ) from None
    except env.llmchat_template_raised as err:
        raise TemplateRenderError(
            f"{label} raised an error: {err.message}; {OVERRIDE_HINT}", "raised", str(err.message)
        ) from None
    except RecursionError:
        raise TemplateRenderError(f"{label} was stopped: it recursed too deeply; {OVERRIDE_HINT}", "limit") from None
    except MemoryError:
        raise TemplateRenderError(f"{label} was stopped: it ran out of memory; {OVERRIDE_HINT}", "limit") from None
    except Exception as err:  # jinja2 errors, TypeError, OverflowError from range(): the template's bug
        detail = f"{type(err).__name__}: {err}"
        raise TemplateRenderError(f"{label} failed to render ({detail}); {OVERRIDE_HINT}", "error", detail) from None
    finally:
        _ACTIVE_BUDGET.reset(token)
        _PROTECTED.reset(protected_token)
    return "".join(chunks)
