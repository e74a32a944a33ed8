"""The sandbox chat templates render in: a jinja2 ImmutableSandboxedEnvironment plus limits.

A chat template comes from whoever made the GGUF file, so rendering one is running someone
else's code. On top of jinja2's sandbox (which already refuses `__globals__`, `__subclasses__`
and every other underscore attribute) this module:
    * refuses `{% include %}`, `{% import %}`, `{% from %}` and `{% extends %}` (there is no loader);
    * drops the `cycler`, `joiner` and `lipsum` globals that templates never need;
    * routes every loop, call, operator, filter and output through the guards of
      llmchat.prompt.sandbox_limits, which stop a render past its step, time or size limits, so
      neither `range(10**12)`, nested loops, recursive macros nor string doubling can hang or
      exhaust memory;
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
from datetime import datetime
from typing import Any, Callable, Mapping

from llmchat.errors import TemplateError
from llmchat.prompt import sandbox_limits as limits
from llmchat.prompt.sandbox_limits import (
    ACTIVE_BUDGET,
    RenderBudget,
    RenderLimitExceeded,
    check_binop,
    check_format_string,
    check_str_method,
    check_value,
    current_budget,
    guard_concat,
    guard_iter,
    guard_output,
    guarded_filter,
    materialize,
)

OVERRIDE_HINT = "choose another with --template NAME|PATH (`llmchat template list` shows the built-ins)"


class TemplateRenderError(TemplateError):
    """A TemplateError that also says what kind of failure it was, for the system-prompt probe."""

    def __init__(self, message: str, kind: str, detail: str = ""):
        super().__init__(message)
        self.kind = kind  # "raised" | "error" | "refused" | "limit"
        self.detail = detail or message  # the reason alone, without the source and the hint


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
    items = materialize(value)
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
            current_budget().tick()
            if any(obj is guard for guard in self.llmchat_guards):
                # Jinja passes loop/block variables for pass_context callables; guards take none.
                kwargs.pop("_loop_vars", None)
                kwargs.pop("_block_vars", None)
                return obj(*args, **kwargs)
            owner = getattr(obj, "__self__", None)
            if isinstance(owner, str):
                args = check_str_method(owner, getattr(obj, "__name__", ""), args, kwargs)
            return check_value(super().call(context, obj, *args, **kwargs), "a call")

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
                check_format_string(fmt, values, f"str.{value.__name__}()")
                return wrapped(*args, **kwargs)

            return checked

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            current_budget().tick()
            check_binop(operator, left, right)
            return check_value(super().call_binop(context, operator, left, right), f"the {operator} operator")

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
    env.filters = {name: guarded_filter(name, func) for name, func in env.filters.items()}

    # Called from the code _GuardInserter adds; reached as `environment.<name>`, so a template
    # cannot rebind them.
    env.llmchat_guard_iter = guard_iter
    env.llmchat_guard_concat = guard_concat
    env.llmchat_guard_output = guard_output
    env.llmchat_guards = (guard_iter, guard_concat, guard_output)
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

    if len(source) > limits.MAX_TEMPLATE_CHARS:
        raise TemplateRenderError(
            f"{label} is {len(source):,} characters long (limit {limits.MAX_TEMPLATE_CHARS:,}), far beyond any real chat "
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
    budget = RenderBudget()
    token = ACTIVE_BUDGET.set(budget)
    protected: set[int] = set()
    _reachable_lists(dict(context), protected)
    protected_token = _PROTECTED.set(frozenset(protected))
    chunks: list[str] = []
    size = 0
    try:
        for chunk in compiled.generate(**context):
            size += len(chunk)
            if size > limits.MAX_PROMPT_CHARS:
                raise RenderLimitExceeded(f"its output passed {limits.MAX_PROMPT_CHARS:,} characters")
            chunks.append(chunk)
    except RenderLimitExceeded as err:
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
        ACTIVE_BUDGET.reset(token)
        _PROTECTED.reset(protected_token)
    return "".join(chunks)
