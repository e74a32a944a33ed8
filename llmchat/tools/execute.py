"""One tool call, run safely, always ending in a CallRecord.

Order: the tool must exist; the arguments must be a JSON object that satisfies the tool's schema
(checked with jsonschema before anything runs); the approval policy must allow it; then it runs
under a timeout, and its output is cut to the cap with a marker. Every failure (unknown tool,
invalid arguments, refusal, exception, timeout, an MCP server that died) becomes text for the
model, never an exception for the caller: the chat goes on.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from llmchat.tools.approval import Answer, ApprovalPolicy, refusal_text
from llmchat.tools.spec import DEFAULT_MAX_OUTPUT_BYTES, DEFAULT_TIMEOUT_S, CallRecord, ToolFailure, ToolSpec

TRUNCATION_MARKER = "\n[output truncated: {dropped} of {total} bytes left out; the cap is {cap} bytes]"


def arguments_error(spec: ToolSpec, arguments: Any) -> str | None:
    """Why these arguments may not reach the tool, or None when they satisfy its schema."""
    from jsonschema import Draft202012Validator
    from jsonschema.validators import validator_for

    if not isinstance(arguments, dict):
        return f"the arguments of {spec.name} must be a JSON object, not {type(arguments).__name__}"
    # In the schema's own dialect (MCP servers often declare draft-07), 2020-12 when it names none.
    validator = validator_for(spec.parameters, default=Draft202012Validator)(spec.parameters)
    errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
    if not errors:
        return None
    first = errors[0]
    where = "/".join(str(part) for part in first.absolute_path)
    return f"invalid arguments for {spec.name}" + (f" at {where}" if where else "") + f": {first.message}"


def cap_output(text: str, cap_bytes: int) -> str:
    """The text cut to at most cap_bytes of UTF-8 (on a character boundary), with a marker saying so."""
    data = text.encode("utf-8")
    if len(data) <= cap_bytes:
        return text
    kept = data[:cap_bytes].decode("utf-8", errors="ignore")
    dropped = len(data) - len(kept.encode("utf-8"))
    return kept + TRUNCATION_MARKER.format(dropped=dropped, total=len(data), cap=cap_bytes)


def parse_arguments(raw: Any) -> tuple[Any, str | None]:
    """Arguments as the model gave them: an object, or JSON text of one (some formats give a string)."""
    if isinstance(raw, str):
        try:
            return json.loads(raw) if raw.strip() else {}, None
        except json.JSONDecodeError as err:
            return raw, f"the arguments are not valid JSON ({err.msg} at column {err.colno})"
    return raw, None


def run_call(
    tools: Mapping[str, ToolSpec],
    name: str,
    raw_arguments: Any,
    policy: ApprovalPolicy,
    *,
    ask: Callable[[str, Any], Answer] | None = None,
    notify: Callable[[str], None] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
) -> CallRecord:
    """Run one call the model asked for. `ask(name, arguments)` asks the person (terminal only);
    `notify(line)` shows a notice on stderr. Never raises for anything the tool or model did."""
    started = time.perf_counter()

    def record(*, approved: bool, result: str | None = None, error: str | None = None, arguments: Any) -> CallRecord:
        return CallRecord(name, arguments, approved, time.perf_counter() - started, result, error)

    spec = tools.get(name)
    arguments, parse_error = parse_arguments(raw_arguments)
    if spec is None:
        known = ", ".join(sorted(tools)) or "none"
        return record(approved=False, error=f'tool "{name}" does not exist (tools: {known})', arguments=arguments)
    problem = parse_error or arguments_error(spec, arguments)
    if problem:
        return record(approved=False, error=problem, arguments=arguments)

    decision = policy.decide(name, spec.approve, spec.source)
    if decision.ask:
        answer: Answer = ask(name, arguments) if ask is not None else "no"
        decision = policy.answer(name, answer)
    if not decision.run:
        if decision.notice and notify is not None:
            notify(decision.notice)
        return record(approved=False, error=refusal_text(name, policy.interactive), arguments=arguments)

    limit = spec.timeout_s or timeout_s
    cap = spec.max_output_bytes or max_output_bytes
    try:
        output = spec.run(arguments, limit)
    except ToolFailure as err:
        return record(approved=True, error=cap_output(str(err), cap), arguments=arguments)
    except Exception as err:  # a source's own bug must not end the chat either
        return record(approved=True, error=cap_output(f"{type(err).__name__}: {err}", cap), arguments=arguments)
    return record(approved=True, result=cap_output(output, cap), arguments=arguments)
