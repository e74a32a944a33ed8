"""Grammars that hold a reply to a shape: JSON Schema -> GBNF, and `--grammar` files.

Why each part is the way it is:
- The converter is llmchat's own (engine.schema_algebra takes applicators apart, engine.schema_grammar
  and its neighbours write rules): every keyword is held exactly or refused with a usage error
  naming it and where it is, never dropped. llama-cpp-python's converter skipped keywords
  silently, read `{}` as "an object" and let invalid instances through: measured against the
  JSON Schema Test Suite in docs/structured-output.md (bench/schema_suite.py).
- A missing `additionalProperties` beside named properties is read as false. That only narrows
  what the model may write; what it writes still validates against the schema as the user gave it.
- The grammar is parsed by llama.cpp here, before any model loads, so a schema whose grammar
  llama.cpp cannot read is a usage error now, not after the load.

Holding the sampled reply to the grammar is llmchat.engine.grammar_gate's job, and putting it into
a sampler chain llmchat.engine.sampler's; this module loads no llama.cpp sampler.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The converter (engine.schema_*) is imported where a schema is compiled: a run without --schema
# or tools never pays for it (tests/test_oneshot_imports.py).
from llmchat.edges.bounded_input import ANY_TEXT, read_file
from llmchat.errors import UsageError

MAX_DROPS = 64  # keywords held_schema may leave out of one tool schema


@dataclass(frozen=True)
class Grammar:
    """A GBNF grammar (root rule `root`) and where it came from, for messages."""

    text: str
    source: str


# --- JSON Schema -> GBNF ------------------------------------------------------------------------------
def schema_to_gbnf(schema: dict[str, Any]) -> str:
    """The GBNF that holds a reply to exactly `schema`; UsageError (a Refusal for a keyword) for
    anything the grammar cannot hold."""
    from llmchat.engine.grammar_probe import check_parses
    from llmchat.engine.schema_grammar import Compiler

    try:
        text = Compiler(schema).compile()
    except RecursionError:
        raise UsageError("the schema nests too deeply for a grammar; simplify it") from None
    check_parses(text, "the grammar of this schema")
    return text


def held_schema(schema: Any) -> tuple[dict[str, Any], list[str]]:
    """A copy of `schema` without the keywords the grammar cannot hold, and what was dropped
    ("minimum at /properties/count"). For a tool's parameters: its arguments are still validated
    against the whole schema after sampling, so a dropped keyword widens the grammar, never the check."""
    from llmchat.engine.schema_algebra import Refusal
    from llmchat.engine.schema_grammar import Compiler

    held: Any = copy.deepcopy(schema) if isinstance(schema, dict) else {}
    dropped: list[str] = [] if isinstance(schema, dict) or schema is True else [f"the schema {schema!r} at /"]
    for _ in range(MAX_DROPS):
        try:
            Compiler(held).compile()
            return held, dropped
        except Refusal as refusal:
            if not _drop(held, refusal.keyword, refusal.where):
                return held, dropped  # nothing left to drop: schema_to_gbnf says why
            dropped.append(f"{refusal.keyword} at {refusal.where or '/'}")
        except (UsageError, RecursionError):
            return held, dropped
    return held, dropped


def _drop(schema: Any, keyword: str, where: str) -> bool:
    """Remove `keyword` from the node at `where` (a JSON pointer), else from the first node that has it."""
    node: Any = schema
    for part in [p for p in where.split("/") if p]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            node = None
            break
    if isinstance(node, dict) and keyword in node:
        del node[keyword]
        return True
    stack = [schema]
    while stack:
        node = stack.pop(0)
        if isinstance(node, dict):
            if keyword in node:
                del node[keyword]
                return True
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


# --- GBNF files ---------------------------------------------------------------------------------------
def load_gbnf(path: Path) -> Grammar:
    """A `--grammar FILE`; its syntax is checked against the model's vocabulary once it is loaded
    (llmchat.engine.grammar_gate.check_grammar)."""
    try:
        text = read_file(path.expanduser(), f"--grammar {path}", ANY_TEXT, advice="pass a .gbnf file").decode("utf-8")
    except FileNotFoundError:
        raise UsageError(f"--grammar {path}: no such file; pass a .gbnf file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"--grammar {path}: cannot read it as UTF-8 text ({err})") from None
    if not text.strip():
        raise UsageError(f"--grammar {path} is empty; write a GBNF grammar with a root rule")
    return Grammar(text, f"--grammar {path}")
