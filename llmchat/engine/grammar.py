"""Grammars that hold a reply to a shape: JSON Schema -> GBNF, GBNF checks, and the grammar sampler.

Why each part is the way it is:
- The converter is llama.cpp's own, as llama-cpp-python ships it (`llama_cpp.llama_grammar`), but
  that converter skips keywords it cannot express without a word, and llama-cpp-python falls back
  to "any JSON" when conversion fails. Here every keyword is checked first: one the grammar
  cannot enforce is refused with a usage error naming it and where it is, never dropped.
  Two gaps of the shipped converter are filled: integer bounds (`minimum`, `maximum`, the
  exclusive ones) become digit-range rules, and a JSON string may not hold raw control
  characters (the shipped `char` rule allowed a raw newline, which no JSON parser accepts).
- The converter treats a missing `additionalProperties` as false. That only narrows what the model
  may write; what it writes still validates against the schema as the user gave it.
- `GrammarGate` is the sampler. llama.cpp's grammar sampler checks every token of the vocabulary at
  every step (Gemma 3 has 262,144), so instead the gate lets the usual samplers pick first and asks
  the grammar about that one token; only when the grammar refuses it are all candidates filtered
  and the pick made again (what llama.cpp's common sampler did before 2025-12). At temperature 0
  the result is exactly the grammar-first result: if the top token is allowed it is also the top
  allowed token. At temperature > 0 an allowed token is kept with its unconstrained probability,
  as in llama.cpp then. On a refusal the gate first filters only the top candidates by logit
  (`TOP_CANDIDATES`, ties at the edge included) and passes over the whole vocabulary only when
  none of them is allowed: at temperature 0 that is still exact (the best allowed token, if it
  is among them, is the best allowed of all), and a refusal costs about 1 ms on Gemma 3 instead
  of a 40-60 ms pass. At temperature > 0 the pick is then among the allowed top candidates,
  which hold nearly all of the probability top-k/top-p/min-p keep. Measured cost:
  bench/results/schema_cost.md.
- Under a grammar a detected loop is steered out of (engine.loop_exit): the gate picks the tokens
  that close the repeating list or string once the grammar allows them.
- The gate can start late (`start_after`): a thinking model writes its reasoning freely and is held
  to the grammar only once the text that ends the thinking has been sampled. A lazy tool-call
  grammar (`feed_trigger`) starts at its trigger text (`<tool_call>`): when the trigger has been
  sampled, the text from the trigger on is fed through the grammar first, as llama.cpp's lazy
  grammars do, and the grammar holds the rest of the call.
"""

from __future__ import annotations

import ctypes
import json
import math
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmchat.engine.loop_exit import PATIENCE, JsonNesting
from llmchat.errors import UsageError

if TYPE_CHECKING:
    from llmchat.engine.loop_exit import LoopExit

MAX_INTEGER_DIGITS = 16  # what the converter's own integer rule allows
# On a refusal, how many of the best candidates are filtered before the whole vocabulary is.
TOP_CANDIDATES = 256
_TYPES = {"string", "number", "integer", "boolean", "null", "object", "array"}
_FORMATS = {"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5"}
_ANNOTATIONS = {
    "title",
    "description",
    "$schema",
    "$id",
    "$comment",
    "default",
    "examples",
    "readOnly",
    "writeOnly",
    "deprecated",
    "$defs",
    "definitions",
}
_ENFORCED = {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minItems",
    "maxItems",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "allOf",
    "$ref",
    "pattern",
    "format",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
}
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
# A JSON string character: anything but a quote, a backslash or a control character, or an escape.
_JSON_CHAR = r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])'


@dataclass(frozen=True)
class Grammar:
    """A GBNF grammar (root rule `root`) and where it came from, for messages."""

    text: str
    source: str


# --- JSON Schema -> GBNF ------------------------------------------------------------------------------
def schema_to_gbnf(schema: dict[str, Any]) -> str:
    """The GBNF that holds a reply to `schema`; UsageError for anything the grammar cannot enforce."""
    check_enforceable(schema)
    from llmchat.engine.bindings import library_module

    SchemaConverter: Any = library_module("llama_grammar").SchemaConverter

    class Converter(SchemaConverter):
        def visit(self, node: dict[str, Any], name: str) -> str:
            if node.get("type") == "integer" and any(key in node for key in _BOUNDS):
                low, high = integer_bounds(node)
                rule_name = name or "root"
                if rule_name in ("integer", "number", "integral-part"):
                    rule_name += "-"
                return str(self._add_rule(rule_name, f"({integer_range_rule(low, high)}) space"))
            return str(super().visit(node, name))

        def _add_primitive(self, name: str, rule: Any) -> str:
            if name == "char":
                rule = type(rule)(_JSON_CHAR, [])
            return str(super()._add_primitive(name, rule))

    converter = Converter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    try:
        resolved = converter.resolve_refs(json.loads(json.dumps(schema)), "input")
        converter.visit(resolved, "")
        return str(converter.format_grammar())
    except (AssertionError, ValueError, KeyError, TypeError, RecursionError, NotImplementedError) as err:
        raise UsageError(f"llama.cpp's converter cannot turn this schema into a grammar: {err}; simplify it") from None


def check_enforceable(schema: Any, where: str = "") -> None:
    """Refuse every keyword the grammar would skip, naming it and its place (a JSON pointer)."""
    at = where or "the top level"
    if not isinstance(schema, dict):
        raise UsageError(f"the schema at {at} must be an object, got {json.dumps(schema)}; use {{}} for any value")
    for key in schema:
        if key not in _ENFORCED and key not in _ANNOTATIONS:
            raise UsageError(
                f"the JSON Schema keyword {key!r} at {at} cannot be enforced by llama.cpp's grammar; remove it"
            )
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    for name in kinds:
        if name not in _TYPES:
            raise UsageError(f"unknown type {name!r} at {at}; use one of {', '.join(sorted(_TYPES))}")
    if "properties" in schema and ("anyOf" in schema or "oneOf" in schema):
        raise UsageError(f"at {at}, 'properties' beside 'anyOf'/'oneOf' is not supported by the grammar; nest them")
    if "pattern" in schema and ("minLength" in schema or "maxLength" in schema):
        raise UsageError(
            f"at {at}, 'pattern' with 'minLength'/'maxLength' is not supported; put the length in the pattern"
        )
    if "format" in schema and schema["format"] not in _FORMATS:
        raise UsageError(
            f"format {schema['format']!r} at {at} cannot be enforced by the grammar; use one of {', '.join(sorted(_FORMATS))}"
        )
    if "pattern" in schema:
        pattern = schema["pattern"]
        if not (isinstance(pattern, str) and pattern.startswith("^") and pattern.endswith("$")):
            raise UsageError(f"the pattern at {at} must be anchored, ^...$ (the grammar matches the whole string)")
    bounds = [key for key in _BOUNDS if key in schema]
    if bounds:
        if kinds != ["integer"]:
            raise UsageError(
                f"{bounds[0]} at {at}: the grammar can bound integers only; use type integer, or drop the bound"
            )
        integer_bounds(schema, at)
    if "prefixItems" in schema:  # listed for the message; the keyword check above refuses it
        raise UsageError(f"prefixItems at {at} is not supported; use items: [...]")
    properties = schema.get("properties", {})
    if not isinstance(properties, dict):
        raise UsageError(f"'properties' at {at} must be an object")
    for name in schema.get("required", []):
        if name not in properties:
            raise UsageError(f"required property {name!r} at {at} has no schema under 'properties'; add one")
    for name, sub in properties.items():
        check_enforceable(sub, f"{where}/properties/{name}")
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        check_enforceable(extra, f"{where}/additionalProperties")
    items = schema.get("items")
    if isinstance(items, list):
        for i, sub in enumerate(items):
            check_enforceable(sub, f"{where}/items/{i}")
    elif items is not None:
        check_enforceable(items, f"{where}/items")
    for key in ("anyOf", "oneOf", "allOf"):
        for i, sub in enumerate(schema.get(key, [])):
            check_enforceable(sub, f"{where}/{key}/{i}")
    for key in ("$defs", "definitions"):
        for name, sub in schema.get(key, {}).items():
            check_enforceable(sub, f"{where}/{key}/{name}")
    ref = schema.get("$ref")
    if ref is not None and not (isinstance(ref, str) and ref.startswith("#/")):
        raise UsageError(f"$ref {ref!r} at {at}: only references inside the schema (#/...) are supported")


def integer_bounds(schema: dict[str, Any], at: str = "the schema") -> tuple[int | None, int | None]:
    """The inclusive integer range the bounds keywords allow (None: unbounded on that side)."""
    values: dict[str, int] = {}
    for key in _BOUNDS:
        if key not in schema:
            continue
        value = schema[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise UsageError(f"{key} at {at} must be a number (draft-4 boolean exclusive bounds are not supported)")
        values[key] = math.ceil(value) if "inimum" in key else math.floor(value)
        if key == "exclusiveMinimum":
            values[key] = math.floor(value) + 1
        elif key == "exclusiveMaximum":
            values[key] = math.ceil(value) - 1
    lows = [values[k] for k in ("minimum", "exclusiveMinimum") if k in values]
    highs = [values[k] for k in ("maximum", "exclusiveMaximum") if k in values]
    low, high = (max(lows) if lows else None), (min(highs) if highs else None)
    if low is not None and high is not None and low > high:
        raise UsageError(f"the bounds at {at} allow no integer ({low} > {high})")
    return low, high


def integer_range_rule(low: int | None, high: int | None) -> str:
    """A GBNF expression for the integers in [low, high], written without leading zeros.

    An open side is bounded by what a 16-digit integer can hold, as the converter's own rule is."""
    limit = 10**MAX_INTEGER_DIGITS - 1
    low = -limit if low is None else low
    high = limit if high is None else high
    parts = []
    if low < 0:
        negatives = _digit_ranges(max(1, -high) if high < 0 else 1, -low)
        parts.append('"-" (' + " | ".join(negatives) + ")")
    if high >= 0:
        parts.extend(_digit_ranges(max(low, 0), high))
    return " | ".join(parts)


def _digit_ranges(low: int, high: int) -> list[str]:
    """Split [low, high] (non-negative) into runs that a prefix, one digit range and k free digits spell."""
    rules = []
    if low == 0:
        rules.append('"0"')
        low = 1
    while low <= high:
        step = 1
        while low % (step * 10) == 0 and low + step * 10 - 1 <= high:
            step *= 10
        count = min((high - low + 1) // step, 10 - (low // step) % 10)
        first = (low // step) % 10
        prefix = str(low // (step * 10)) if low >= step * 10 else ""
        digits = f"[{first}-{first + count - 1}]" if count > 1 else f'"{first}"'
        free = " [0-9]" * len(str(step)[1:])
        rules.append((f'"{prefix}" ' if prefix else "") + digits + free)
        low += count * step
    return rules


# --- GBNF files ---------------------------------------------------------------------------------------
def load_gbnf(path: Path) -> Grammar:
    """A `--grammar FILE`; its syntax is checked against the model's vocabulary once it is loaded."""
    try:
        text = path.expanduser().read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"--grammar {path}: no such file; pass a .gbnf file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"--grammar {path}: cannot read it as UTF-8 text ({err})") from None
    if not text.strip():
        raise UsageError(f"--grammar {path} is empty; write a GBNF grammar with a root rule")
    return Grammar(text, f"--grammar {path}")


def check_grammar(grammar: Grammar, vocab: Any) -> None:
    """Parse the grammar with llama.cpp as the sampler will (UsageError with llama.cpp's reason)."""
    from llmchat.engine import logs
    from llmchat.engine.bindings import llama_cpp

    logs.recent_errors.clear()
    sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar.text.encode("utf-8"), b"root")
    if not sampler:
        reason = logs.last_error() or "llama.cpp could not parse it"
        raise UsageError(f"{grammar.source}: not a usable GBNF grammar: {' '.join(reason.split())}; fix the grammar")
    llama_cpp.llama_sampler_free(sampler)


# --- the sampler --------------------------------------------------------------------------------------
_live: dict[int, GrammarGate] = {}  # gates llama.cpp holds, kept alive for their callbacks
_retired: list[GrammarGate] = []  # freed by llama.cpp; dropped at the next gate (not inside the callback)


class GrammarGate:
    """A llama.cpp sampler that owns the samplers after the penalties (`inner`) and a grammar.

    Put it into a chain in place of those samplers: `apply` picks with `inner`, keeps the pick when
    the grammar allows it, and otherwise filters every candidate by the grammar and picks again;
    `accept` advances the grammar. llama.cpp frees it with the chain, and it frees `inner`.
    With `start_after`, the grammar applies only once that text has been sampled.
    """

    def __init__(
        self,
        vocab: Any,
        grammar: Grammar,
        inner: Any,
        *,
        start_after: str | None = None,
        greedy: bool = False,
        loop_exit: LoopExit | None = None,
        feed_trigger: bool = False,
    ):
        from llmchat.engine.bindings import llama_cpp

        _retired.clear()
        self._llama = llama_cpp
        self.vocab = vocab
        self.inner = inner
        # A gate that cannot start frees what it was given and what it made (a Ctrl-C here too);
        # once started, llama.cpp frees them through `_free` with the chain that holds the gate.
        with ExitStack() as undo:
            undo.callback(llama_cpp.llama_sampler_free, inner)
            self.grammar = llama_cpp.llama_sampler_init_grammar(vocab, grammar.text.encode("utf-8"), b"root")
            if not self.grammar:
                check_grammar(grammar, vocab)  # raises with llama.cpp's reason
                raise UsageError(f"{grammar.source}: llama.cpp refused the grammar")
            undo.callback(llama_cpp.llama_sampler_free, self.grammar)
            self._start(llama_cpp, start_after, greedy, loop_exit, feed_trigger)
            undo.pop_all()
        if loop_exit is not None:
            loop_exit.gate = self
        _live[id(self)] = self

    def _start(
        self, llama_cpp: Any, start_after: str | None, greedy: bool, loop_exit: LoopExit | None, feed_trigger: bool
    ) -> None:
        """The gate's state and its llama.cpp sampler (`self.sampler`), over `inner` and the grammar."""
        self.start_after = start_after
        self.active = not start_after
        self.feed_trigger = feed_trigger  # the grammar begins with `start_after` itself (lazy)
        # llama.cpp's greedy sampler only marks its pick: the candidates need no copy to filter again.
        self.greedy = greedy
        self._seen = ""  # text sampled so far, while waiting for `start_after`
        self.rejections = 0  # picks the grammar refused
        self.full_passes = 0  # refusals where no top candidate was allowed: a full-vocabulary pass
        self.picks = 0
        import numpy

        self._np = numpy
        # The JSON written under the grammar and a loop to steer out of (engine.loop_exit).
        self.loop_exit = loop_exit
        self.nesting = JsonNesting()
        self._closing: list[int] = []  # closing tokens still to pick
        self._pieces: dict[int, bytes] = {}
        self._saved = ctypes.create_string_buffer(0)
        self._one = (llama_cpp.llama_token_data * 1)()
        self._one_array = llama_cpp.llama_token_data_array(self._one, 1, -1, False)
        iface = llama_cpp.llama_sampler_i()
        self._callbacks = (
            llama_cpp.llama_sampler_i_name(self._name),
            llama_cpp.llama_sampler_i_accept(self._accept),
            llama_cpp.llama_sampler_i_apply(self._apply),
            llama_cpp.llama_sampler_i_reset(self._reset),
            llama_cpp.llama_sampler_i_free(self._free),
        )
        iface.name, iface.accept, iface.apply, iface.reset, iface.free = self._callbacks
        iface.clone = llama_cpp.llama_sampler_i_clone(0)
        self._iface = iface
        self._label = b"llmchat-grammar-gate"
        self.sampler = llama_cpp.llama_sampler_init(ctypes.pointer(iface), None)
        if not self.sampler:
            raise MemoryError("llama.cpp could not make the grammar gate's sampler")

    # llama.cpp calls these; they must never raise into C.
    def _name(self, smpl: Any) -> bytes:
        return self._label

    def _apply(self, smpl: Any, cur_p: Any) -> None:
        llama = self._llama
        if not self.active:
            llama.llama_sampler_apply(self.inner, cur_p)
            return
        cur = cur_p.contents
        if self._closing:  # the rest of a loop's closing text
            self._force(cur, self._closing.pop(0))
            return
        steering = self.loop_exit is not None and self.loop_exit.keep is not None
        if steering and self._close_loop(cur, None):
            return
        self._pick(cur_p)
        if steering:
            self._close_loop(cur, int(cur.data[cur.selected].id))

    def _pick(self, cur_p: Any) -> None:
        """The usual samplers' pick if the grammar allows it, else the best allowed candidate."""
        llama = self._llama
        cur = cur_p.contents
        size = int(cur.size)
        nbytes = size * ctypes.sizeof(llama.llama_token_data)
        if ctypes.sizeof(self._saved) < nbytes:
            self._saved = ctypes.create_string_buffer(nbytes)
        if not self.greedy:
            ctypes.memmove(self._saved, cur.data, nbytes)
        llama.llama_sampler_apply(self.inner, cur_p)
        self.picks += 1
        if 0 <= cur.selected < cur.size and self._allows(cur.data[cur.selected]):
            return
        self.rejections += 1
        if not self.greedy:
            ctypes.memmove(cur.data, self._saved, nbytes)
        cur.size, cur.selected, cur.sorted = size, -1, False
        if self._pick_among_top(cur_p, size):
            return
        self.full_passes += 1
        cur.size, cur.selected, cur.sorted = size, -1, False
        llama.llama_sampler_apply(self.grammar, cur_p)
        llama.llama_sampler_apply(self.inner, cur_p)

    def _pick_among_top(self, cur_p: Any, size: int) -> bool:
        """Filter only the best `TOP_CANDIDATES` (and any tied with the last of them) by the
        grammar and pick among those allowed; False, with the candidates as they were, when none is.

        The kept candidates stay in their original (token id) order at the front of the array, so
        that a greedy pick breaks ties as it would over the whole vocabulary."""
        np = self._np
        if size <= TOP_CANDIDATES:
            return False
        cur = cur_p.contents
        rows = np.ctypeslib.as_array(ctypes.cast(cur.data, ctypes.POINTER(ctypes.c_int32)), shape=(size, 3))
        logits = rows[:, 1].view(np.float32)
        edge = np.partition(logits, size - TOP_CANDIDATES)[size - TOP_CANDIDATES]
        best = np.flatnonzero(logits >= edge)
        if len(best) > 4 * TOP_CANDIDATES:  # a flat distribution: no short list to try
            return False
        n = len(best)
        front = rows[:n].copy()
        rows[:n] = rows[best]
        cur.size, cur.selected, cur.sorted = n, -1, False
        self._llama.llama_sampler_apply(self.grammar, cur_p)
        if not np.isfinite(logits[:n]).any():
            rows[:n] = front  # restore: the caller passes over the whole vocabulary
            return False
        self._llama.llama_sampler_apply(self.inner, cur_p)
        return True

    # --- steering out of a loop (engine.loop_exit) ------------------------------------------------
    def _close_loop(self, cur: Any, picked: int | None) -> bool:
        """While steering out of a loop: pick the first token of the text that closes the
        repeating structure, when the grammar allows that text now (True).

        Inside an item of the repeating list (a string, an object) the model may first finish it,
        for up to `PATIENCE` picks: the closing text replaces the model's `picked` token once that
        token would end the item, so that the list ends after a whole item, not a cut one."""
        loop_exit, nesting = self.loop_exit, self.nesting
        assert loop_exit is not None and loop_exit.keep is not None
        text = nesting.closing_text(loop_exit.keep)
        if text == "":
            loop_exit.keep = None  # the model closed the repeating structure itself
            return False
        if text is None:  # in the middle of an escape
            return False
        item_level = loop_exit.keep + 1
        if len(nesting.stack) > item_level and loop_exit.waited < PATIENCE:
            if picked is None:
                return False  # first see what the model picks
            loop_exit.waited += 1
            if not nesting.reaches(self._piece(picked), item_level) and loop_exit.waited < PATIENCE:
                return False
        tokens = self._tokenize(text)
        if not tokens or not self._allows_all(tokens):
            return False
        loop_exit.closed()
        self._closing = tokens[1:]
        self._force(cur, tokens[0])
        return True

    @staticmethod
    def _force(cur: Any, token: int) -> None:
        """Make `token` the pick: llama.cpp takes the id at `selected` (this is the chain's last step)."""
        cur.data[0].id = token
        cur.selected = 0

    def _tokenize(self, text: str) -> list[int]:
        llama = self._llama
        data = text.encode("utf-8")
        buffer = (llama.llama_token * (len(data) + 4))()
        n = llama.llama_tokenize(self.vocab, data, len(data), buffer, len(buffer), False, False)
        return list(buffer[: max(n, 0)])

    def _allows_all(self, tokens: list[int]) -> bool:
        """Whether the grammar, from where it is now, accepts `tokens` one after the other."""
        llama = self._llama
        probe = llama.llama_sampler_clone(self.grammar)
        try:
            for token in tokens:
                one = self._one[0]
                one.id, one.logit, one.p = token, 0.0, 0.0
                self._one_array.size, self._one_array.selected, self._one_array.sorted = 1, -1, False
                llama.llama_sampler_apply(probe, ctypes.byref(self._one_array))
                if not math.isfinite(self._one[0].logit):
                    return False
                llama.llama_sampler_accept(probe, token)
            return True
        finally:
            llama.llama_sampler_free(probe)

    def _piece(self, token: int) -> bytes:
        piece = self._pieces.get(token)
        if piece is None:
            buffer = ctypes.create_string_buffer(256)
            n = self._llama.llama_token_to_piece(self.vocab, token, buffer, 256, 0, False)
            piece = self._pieces[token] = buffer.raw[: max(n, 0)]
        return piece

    def _allows(self, candidate: Any) -> bool:
        one = self._one[0]
        one.id, one.logit, one.p = candidate.id, candidate.logit, candidate.p
        self._one_array.size, self._one_array.selected, self._one_array.sorted = 1, -1, False
        self._llama.llama_sampler_apply(self.grammar, ctypes.byref(self._one_array))
        return bool(math.isfinite(self._one[0].logit))

    def _accept(self, smpl: Any, token: int) -> None:
        llama = self._llama
        llama.llama_sampler_accept(self.inner, token)
        if self.active:
            llama.llama_sampler_accept(self.grammar, token)
            if self.loop_exit is not None:
                self.nesting.feed(self._piece(token))
            return
        assert self.start_after is not None
        piece = ctypes.create_string_buffer(256)
        n = llama.llama_token_to_piece(self.vocab, token, piece, 256, 0, True)  # control tokens as text
        self._seen += piece.raw[: max(n, 0)].decode("utf-8", errors="replace")
        if self.start_after in self._seen:
            if self.feed_trigger:
                self._start_at_trigger()
                return
            self.active = True
            self._seen = ""

    def _start_at_trigger(self) -> None:
        """Feed the text from the trigger on through the grammar and switch it on. When the
        grammar refuses that text (the token that completed the trigger carried more than the
        grammar allows), it stays off: the reply is free text and the parser decides."""
        assert self.start_after is not None
        tail = self._seen[self._seen.index(self.start_after) :]
        self._seen = ""
        tokens = self._tokenize(tail)
        if not self._allows_all(tokens):
            return
        for token in tokens:
            self._llama.llama_sampler_accept(self.grammar, token)
            if self.loop_exit is not None:
                self.nesting.feed(self._piece(token))
        self.active = True

    def _reset(self, smpl: Any) -> None:
        self._llama.llama_sampler_reset(self.inner)
        self._llama.llama_sampler_reset(self.grammar)
        self.active = not self.start_after
        self._seen = ""
        self.nesting = JsonNesting()
        self._closing = []

    def _free(self, smpl: Any) -> None:
        self._llama.llama_sampler_free(self.inner)
        self._llama.llama_sampler_free(self.grammar)
        self.inner = self.grammar = None
        if self.loop_exit is not None and self.loop_exit.gate is self:
            self.loop_exit.gate = None
        gate = _live.pop(id(self), None)
        if gate is not None:
            _retired.append(gate)


def constrained(
    chain: Any,
    vocab: Any,
    grammar: Grammar | None,
    *,
    start_after: str | None = None,
    greedy: bool = False,
    loop_exit: LoopExit | None = None,
    feed_trigger: bool = False,
) -> Any:
    """Where a sampler chain's samplers after the penalties go: `chain` itself without a grammar,
    else a new inner chain that a `GrammarGate` in `chain` owns. Add the penalties to `chain`
    before calling this, and the rest to what it returns. `loop_exit`: the reply rules' link for
    steering out of a loop (engine.loop_exit)."""
    if grammar is None:
        return chain
    from llmchat.engine.bindings import llama_cpp

    inner = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    gate = GrammarGate(  # it owns `inner` from here, and frees it if it cannot start
        vocab, grammar, inner, start_after=start_after, greedy=greedy, loop_exit=loop_exit, feed_trigger=feed_trigger
    )
    with ExitStack() as undo:  # until the chain holds the gate, freeing the gate frees `inner` and the grammar
        undo.callback(llama_cpp.llama_sampler_free, gate.sampler)
        llama_cpp.llama_sampler_chain_add(chain, gate.sampler)  # the chain owns the gate: freed with it
        undo.pop_all()
    return inner
